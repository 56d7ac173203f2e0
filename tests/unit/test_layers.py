"""The layers point one way: mlreg (the application) -> pipelines -> registry.

Read from the source with ``ast``: every ``import``/``from ... import`` anywhere in a module
(inside functions and ``TYPE_CHECKING`` blocks too; a relative one resolved against the module's
package) and every literal ``importlib.import_module("...")``.  Each rule has a positive control:
a synthetic module breaking it is flagged.  Within the layers, a few packages are fenced off (the
promotion never reaches the development stack nor MLflow's adapters; the contracts stay pure),
and no two first-party modules import each other, however indirectly (the cycle test counts
function-local imports, which do run, but not ``if TYPE_CHECKING:`` blocks, which do not).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Iterator
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


def absolute(node: ast.ImportFrom, package: str) -> str:
    """The module a ``from`` import names, a relative one resolved against ``package`` (the
    importing module's package: ``from ..x import y`` in ``a.b.c`` is ``a.x``)."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    anchor = ".".join(parts[: len(parts) - node.level + 1])
    return f"{anchor}.{node.module}" if node.module else anchor


def imported_names(nodes: Iterable[ast.AST], package: str = "") -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import among ``nodes`` (a whole tree's, from
    ``ast.walk``) of a module of ``package``: relative ones resolved against it."""
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or node.level):
            yield node.lineno, absolute(node, package)
        elif isinstance(node, ast.Call) and _is_import_module(node.func) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield node.lineno, first.value


def _is_import_module(func: ast.expr) -> bool:
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in {"import_module", "__import__"}


def package_of(path: Path, root: Path = ROOT) -> str:
    """The package a module file belongs to (a package's ``__init__`` is in its own)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1])


def first_party_imports(package: str, root: Path = ROOT) -> Iterator[tuple[str, str]]:
    """("file:line", imported top-level package) for each first-party import in ``package`` (under
    ``root``), relative imports resolved."""
    for path in sorted((root / package).rglob("*.py")):
        for line, name in imported_names(walked(path), package_of(path, root)):
            top = name.split(".")[0]
            if top in FIRST_PARTY:
                yield f"{path.relative_to(root)}:{line}", top


def first_party_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the first-party packages (a package is its
    ``__init__``)."""
    modules = {}
    for package in FIRST_PARTY:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


MODULES = first_party_modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _run_time_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` but the bodies of ``if TYPE_CHECKING:`` (their ``else`` runs)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _known(name: str) -> str | None:
    """``name`` if it is a first-party module, else its longest first-party prefix (an attribute
    of a module, or a module that no longer exists: its package is what the import runs)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in MODULES:
            return candidate
    return None


def module_imports(module: str, nodes: Iterable[ast.AST]) -> Iterator[tuple[int, str]]:
    """(line, first-party module) of each import among ``nodes`` of ``module``: ``from pkg import
    name`` is ``pkg.name`` where that is a module, else ``pkg``; importing a package is importing
    its ``__init__`` only (not its parents', which would close false cycles)."""
    package = module if MODULES.get(module, Path()).name == "__init__.py" else module.rpartition(".")[0]
    for node in nodes:
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = absolute(node, package)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        elif isinstance(node, ast.Call) and _is_import_module(node.func) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                names = [first.value]
        for name in names:
            found = _known(name)
            if found is not None and found != module:
                yield getattr(node, "lineno", 0), found  # an import or a call: it has one


@functools.cache  # each test walks every module: parsed once a run (the trees are only read)
def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


@functools.cache
def walked(path: Path) -> tuple[ast.AST, ...]:
    """Every node of ``path``'s tree, in ``ast.walk``'s order (walked once a run)."""
    return tuple(ast.walk(parse(path)))


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported first-party module: the line of its first import} (run-time imports)."""
    graph: dict[str, dict[str, int]] = {}
    for module, path in MODULES.items():
        edges = graph.setdefault(module, {})
        for line, target in module_imports(module, _run_time_nodes(parse(path))):
            edges[target] = min(line, edges.get(target, line))
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph`` (iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, {}))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def cycles(graph: dict[str, dict[str, int]]) -> list[str]:
    """Each component of more than one module, with every import that binds it ("file:line imports")."""
    found = []
    for component in strongly_connected(graph):
        if len(component) > 1:
            edges = [
                f"{MODULES[a].relative_to(ROOT)}:{line} imports {b}"
                for a in component
                for b, line in sorted(graph[a].items())
                if b in component
            ]
            found.append(f"{' <-> '.join(component)}:\n  " + "\n  ".join(edges))
    return found


# package prefix -> the first-party modules no module under it may import (anywhere in the file);
# each one exists (test_every_fenced_name_is_a_module_that_exists): a name of a module long gone
# fences nothing
FORBIDDEN = {
    "pipelines.promote": (
        "pipelines.devstack",  # the local development stack: the application hands over URLs
        "registry.mlflow",  # MLflow's adapters: the promotion sees only the Registry Protocol
    ),
}
# package prefix -> the only first-party modules it may import
ONLY = {"registry.contracts": ("registry.contracts", "registry.errors", "registry.settings")}


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def written_imports(module: str, path: Path | None = None) -> Iterator[tuple[str, list[str]]]:
    """("file:line", names) of every import of ``module`` (its file, or ``path``), TYPE_CHECKING
    and functions included: for ``from pkg import a`` the names are ``pkg`` and ``pkg.a`` as
    written (a relative ``pkg`` resolved), whether or not a module ``pkg.a`` exists (yet)."""
    path = MODULES[module] if path is None else path
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in walked(path):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or node.level):
            base = absolute(node, package)
            names = [base, *(f"{base}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Call) and _is_import_module(node.func) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                names = [first.value]
        if names:
            yield f"{where}:{node.lineno}", names  # type: ignore[attr-defined]


def fence_breaches(prefix: str, modules: dict[str, Path]) -> list[str]:
    """Every import of ``modules`` (name -> file) under ``prefix`` of what FORBIDDEN fences off."""
    wrong = []
    for module in (m for m in sorted(modules) if _under(m, prefix)):
        for where, names in written_imports(module, modules[module]):
            banned = [n for n in names if any(_under(n, b) for b in FORBIDDEN[prefix])]
            wrong += [f"{where} imports {banned[0]}"] if banned else []
    return wrong


def resolved_imports(module: str) -> Iterator[tuple[str, str]]:
    """("file:line", first-party module) of every import of ``module``, TYPE_CHECKING included."""
    path = MODULES[module]
    for line, name in module_imports(module, walked(path)):
        yield f"{path.relative_to(ROOT)}:{line}", name


def modules_under(prefix: str) -> list[str]:
    return [module for module in sorted(MODULES) if _under(module, prefix)]


@pytest.mark.parametrize("prefix", sorted(FORBIDDEN))
def test_a_fenced_package_does_not_import_what_it_must_not(prefix: str) -> None:
    wrong = fence_breaches(prefix, MODULES)
    assert wrong == [], f"{prefix} must not import {', '.join(FORBIDDEN[prefix])}:\n" + "\n".join(wrong)


def test_every_fenced_name_is_a_module_that_exists() -> None:
    named = [*(p for p in FORBIDDEN), *(n for names in FORBIDDEN.values() for n in names)]
    named += [*(p for p in ONLY), *(n for names in ONLY.values() for n in names)]
    assert [name for name in named if name not in MODULES] == []


def test_the_fence_catches_a_module_reaching_past_it_relatively_or_not(tmp_path: Path) -> None:
    """The positive control: synthetic modules of the fenced package, importing what it must not
    (relative, absolute, function-local, through importlib), are each flagged at their line."""
    folder = tmp_path / "pipelines" / "promote"
    folder.mkdir(parents=True)
    (folder / "sneaky.py").write_text(
        "from ..devstack import stack\n"
        "def f():\n    from registry.mlflow.sqlite import model_version\n"
        "    importlib.import_module('pipelines.devstack.local_triton')\n"
        "from . import plan\n"
    )
    wrong = fence_breaches("pipelines.promote", {"pipelines.promote.sneaky": folder / "sneaky.py"})
    assert [line.split("sneaky.py:")[1] for line in wrong] == [
        "1 imports pipelines.devstack",
        "3 imports registry.mlflow.sqlite",
        "4 imports pipelines.devstack.local_triton",
    ]


@pytest.mark.parametrize("prefix", sorted(ONLY))
def test_a_pure_package_imports_only_what_it_may(prefix: str) -> None:
    wrong = sorted(
        {
            f"{where} imports {name}"
            for module in modules_under(prefix)
            for where, name in resolved_imports(module)
            if not any(_under(name, allowed) for allowed in ONLY[prefix])
        }
    )
    assert wrong == [], f"{prefix} may import only {', '.join(ONLY[prefix])}:\n" + "\n".join(wrong)


def test_no_two_first_party_modules_import_each_other() -> None:
    found = cycles(import_graph())
    assert found == [], "import cycles (a function-local import is one too):\n" + "\n".join(found)


def test_the_cycle_finder_sees_a_cycle_and_skips_type_checking() -> None:
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3, "d": 4}, "d": {}}
    assert sorted(strongly_connected(graph)) == [["a", "b", "c"], ["d"]]
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from mlreg.cli import main\nelse:\n    import registry.errors\n"
        "def f():\n    from pipelines.promote import plan\n    from registry.contracts.config import X\n"
    )
    found = {name for _, name in module_imports("mlreg.service", _run_time_nodes(ast.parse(source)))}
    assert found == {"registry.errors", "pipelines.promote.plan", "registry.contracts.config"}


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
        "def f():\n    import pipelines.devstack.stack\n    importlib.import_module('mlreg.workflow')\n"
        "from . import sibling\n"
    )
    names = sorted(name for _, name in imported_names(ast.walk(ast.parse(source)), "registry.contracts"))
    assert names == [
        "mlreg.cli",
        "mlreg.workflow",
        "pipelines.devstack.stack",
        "registry.contracts",
        "typing",
    ]


def test_a_synthetic_module_importing_upward_is_flagged(tmp_path: Path) -> None:
    """The positive control of the layer rule, run as it runs on the packages: a module of
    ``registry`` importing the layers above it, absolutely and relatively within its own package."""
    folder = tmp_path / "registry" / "contracts"
    folder.mkdir(parents=True)
    (folder / "upward.py").write_text(
        "from .. import errors\nfrom mlreg import service\ndef f():\n    import pipelines.triton\n"
    )
    found = sorted(first_party_imports("registry", tmp_path))
    assert found == [
        ("registry/contracts/upward.py:1", "registry"),
        ("registry/contracts/upward.py:2", "mlreg"),
        ("registry/contracts/upward.py:4", "pipelines"),
    ]
    assert [top for _, top in found if top not in ALLOWED["registry"]] == ["mlreg", "pipelines"]
