"""The layers point one way: mlreg (the application) -> pipelines -> registry.

Read from the source with ``ast``: every ``import``/``from ... import`` anywhere in a module
(inside functions and ``TYPE_CHECKING`` blocks too; a relative one resolved against the module's
package) and every literal ``importlib.import_module("...")``.  Each rule has a positive control:
a synthetic module breaking it is flagged.  Within the layers, a few packages are fenced off (the
promotion never reaches the development stack nor MLflow's adapters; the contracts stay pure),
and there is no cycle at any level: no two first-party modules import each other, however
indirectly, and no two packages either (``pipelines.storage`` importing ``pipelines.promote``
while a module of ``pipelines.promote`` imports ``pipelines.storage`` is a cycle of packages
although no two modules close one).  Every import counts as an edge: a function-local one, which
runs late, and one under ``if TYPE_CHECKING:``, which never runs but still ties the two modules
together for a reader and for the type checker (a cycle hidden there is a cycle deferred).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Iterator, Mapping
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
        elif (called := literal_import(node)) is not None:
            yield node.lineno, called  # type: ignore[attr-defined]


def literal_import(node: ast.AST) -> str | None:
    """The module an ``importlib.import_module("...")`` (or ``__import__``) call names literally."""
    if isinstance(node, ast.Call) and _is_import_module(node.func) and node.args:
        first = node.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value
    return None


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


def _known(name: str, modules: Mapping[str, Path]) -> str | None:
    """``name`` if it is a first-party module, else its longest first-party prefix (an attribute
    of a module, or a module that no longer exists: its package is what the import runs)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def module_imports(
    module: str, nodes: Iterable[ast.AST], modules: Mapping[str, Path] = MODULES
) -> Iterator[tuple[int, str]]:
    """(line, first-party module) of each import among ``nodes`` of ``module`` (one of
    ``modules``): ``from pkg import name`` is ``pkg.name`` where that is a module, else ``pkg``;
    importing a package is importing its ``__init__`` only (not its parents', which would close
    false cycles)."""
    package = module if modules.get(module, Path()).name == "__init__.py" else module.rpartition(".")[0]
    for node in nodes:
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = absolute(node, package)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        elif (called := literal_import(node)) is not None:
            names = [called]
        for name in names:
            found = _known(name, modules)
            if found is not None and found != module:
                yield getattr(node, "lineno", 0), found  # an import or a call: it has one


@functools.cache  # each test walks every module: parsed once a run (the trees are only read)
def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


@functools.cache
def walked(path: Path) -> tuple[ast.AST, ...]:
    """Every node of ``path``'s tree, in ``ast.walk``'s order (walked once a run)."""
    return tuple(ast.walk(parse(path)))


Graph = dict[str, dict[str, str]]  # node -> {node it imports: "file:line imports module", the first}


def import_graph(modules: Mapping[str, Path] = MODULES, root: Path = ROOT) -> Graph:
    """module -> {imported first-party module: "file:line imports module" of its first import}:
    every import, function-local and ``if TYPE_CHECKING:`` ones included."""
    graph: Graph = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, {})
        lines: dict[str, int] = {}
        for line, target in module_imports(module, walked(path), modules):
            lines[target] = min(line, lines.get(target, line))
        where = path.relative_to(root) if path.is_relative_to(root) else path
        edges.update((target, f"{where}:{line} imports {target}") for target, line in sorted(lines.items()))
    return graph


def _ancestry(a: str, b: str) -> bool:
    """Whether one of the dotted names contains the other (a package and what lies inside it)."""
    return _under(a, b) or _under(b, a)


def package_graph(graph: Graph, depth: int) -> Graph:
    """``graph`` seen at ``depth``: each module stands for the package (or module) its first
    ``depth`` name parts make (``pipelines.storage.s3`` is ``pipelines.storage`` at depth 2),
    an edge kept where it joins two such names neither of which contains the other (a package's
    ``__init__`` importing its own modules, or a subpackage its parent's, is no cycle of
    siblings); each edge keeps one import that makes it (of the first module, by name)."""
    packages: Graph = {}
    for module, edges in sorted(graph.items()):
        source = ".".join(module.split(".")[:depth])
        targets = packages.setdefault(source, {})
        for target, where in sorted(edges.items()):
            node = ".".join(target.split(".")[:depth])
            if not _ancestry(source, node):
                targets.setdefault(node, where)
    return packages


def strongly_connected(graph: Mapping[str, Mapping[str, object]]) -> list[list[str]]:
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


def cycles(graph: Graph) -> list[str]:
    """Each component of more than one node of ``graph``, with every import that binds it."""
    found = []
    for component in strongly_connected(graph):
        if len(component) > 1:
            edges = [where for a in component for b, where in sorted(graph[a].items()) if b in component]
            found.append(f"{' <-> '.join(component)}:\n  " + "\n  ".join(edges))
    return found


DEPTH = max(len(module.split(".")) for module in MODULES)


# package prefix -> the first-party modules no module under it may import (anywhere in the file);
# each one exists (test_every_fenced_name_is_a_module_that_exists): a name of a module long gone
# fences nothing
PROMOTION_FENCE = (
    "pipelines.devstack",  # the local development stack: the application hands over URLs
    "registry.mlflow",  # MLflow's adapters: the promotion sees only the Registry Protocol
)
# the promotion is the engine (pipelines.promote) and the packages it plugs together (issue 47):
# each is fenced the same way
PROMOTION = ("promote", "core", "checks", "guards", "rollout", "fleet", "triton")
FORBIDDEN = {f"pipelines.{package}": PROMOTION_FENCE for package in PROMOTION}
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
        elif (called := literal_import(node)) is not None:
            names = [called]
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


def purity_breaches(prefix: str, modules: Mapping[str, Path] = MODULES) -> list[str]:
    """Every import by a module of ``modules`` (name -> file) under ``prefix`` of a first-party
    module ONLY does not allow it, TYPE_CHECKING and functions included."""
    wrong = set()
    for module in (m for m in sorted(modules) if _under(m, prefix)):
        path = modules[module]
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        for line, name in module_imports(module, walked(path), modules):
            if not any(_under(name, allowed) for allowed in ONLY[prefix]):
                wrong.add(f"{where}:{line} imports {name}")
    return sorted(wrong)


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
    wrong = purity_breaches(prefix)
    assert wrong == [], f"{prefix} may import only {', '.join(ONLY[prefix])}:\n" + "\n".join(wrong)


def test_the_purity_rule_flags_a_contract_module_importing_past_what_it_may(tmp_path: Path) -> None:
    """The positive control: a synthetic module of ``registry.contracts`` importing another
    part of ``registry`` (relatively), ``pipelines`` (in a function) and a module through importlib
    is flagged at each of those lines; what ONLY allows is not."""
    path = tmp_path / "registry" / "contracts" / "sneaky.py"
    path.parent.mkdir(parents=True)
    path.write_text(
        "from ..errors import UsageError\n"
        "from .. import mlflow\n"
        "def f():\n    import pipelines.triton.control\n"
        "    importlib.import_module('registry.export')\n"
        "from . import config\n"
    )
    found = purity_breaches("registry.contracts", {**MODULES, "registry.contracts.sneaky": path})
    assert [line.split("sneaky.py:")[1] for line in found if "sneaky.py:" in line] == [
        "2 imports registry.mlflow",
        "4 imports pipelines.triton.control",
        "5 imports registry.export",
    ]


def test_no_two_first_party_modules_import_each_other() -> None:
    found = cycles(import_graph())
    assert found == [], (
        "import cycles (a function-local import and an `if TYPE_CHECKING:` one are edges too):\n"
        + "\n".join(found)
    )


# A cycle of packages known and being broken, pinned exactly at two name parts while it lasts (its
# packages, in order): a package joining it, a second cycle, or a package leaving it (then take it
# off here) fails.  Empty: issue 47's move (item 2) showed one (pipelines.core <-> pipelines.fleet:
# the context and the undo log named the Fleet), and its seams broke it -- core names the servers
# through its ports (pipelines/core/ports.py ``Servers``, ``Replicas``) and holds the change
# vocabulary (pipelines/core/changes.py) -- so any cycle between packages now fails.
PENDING_PACKAGE_CYCLE: tuple[str, ...] = ()


# issue 47: no package imports a feature it does not own. Each package of the promotion (and the
# pipelines packages beside it) -> the other pipelines packages it may import. The floor first: triton
# (one server) and storage import no other; core (the shared vocabulary) imports no feature (checks,
# guards, rollout, fleet, promote, ledger); a feature imports the floor and the parts it drives;
# promote (the engine) plugs them all together. A new package needs a row (test_every_package_has_a_row).
OWNS = {
    "pipelines.triton": set(),
    "pipelines.storage": set(),
    "pipelines.core": {"pipelines.storage", "pipelines.triton"},
    "pipelines.ledger": {"pipelines.storage"},  # its chain of events is stored objects
    "pipelines.checks": {"pipelines.core", "pipelines.storage", "pipelines.triton"},
    # a load guard reads the replicas it keeps up (the fleet's view, headroom's Change)
    "pipelines.guards": {"pipelines.core", "pipelines.storage", "pipelines.triton", "pipelines.fleet"},
    # the fleet tells the ledger each call it sent (the ledger's Recorder: an observer it is handed)
    "pipelines.fleet": {"pipelines.core", "pipelines.storage", "pipelines.triton", "pipelines.ledger"},
    # a deployer moves the fleet (which asks the load guards: their refusal is core's LoadRefused) and
    # asks the golden inputs for its probes
    "pipelines.rollout": {
        "pipelines.core",
        "pipelines.storage",
        "pipelines.triton",
        "pipelines.fleet",
        "pipelines.checks",
    },
    "pipelines.promote": {
        "pipelines.core",
        "pipelines.storage",
        "pipelines.triton",
        "pipelines.fleet",
        "pipelines.guards",
        "pipelines.checks",
        "pipelines.rollout",
        "pipelines.ledger",
    },
    # the local development stack starts servers and seeds a store; it runs no promotion
    "pipelines.devstack": {"pipelines.core", "pipelines.storage", "pipelines.triton"},
}
FEATURES = ("checks", "guards", "rollout", "fleet", "promote", "ledger")
# (package, the package it still imports that it may not) -- exactly what PENDING_PACKAGE_CYCLE
# pins, while one is pinned; empty since core's undo log, context and reports no longer name the
# Fleet (issue 47 item 3)
PENDING_FEATURE_IMPORTS: set[tuple[str, str]] = set()


def package_of_module(module: str) -> str:
    """The pipelines package ``module`` belongs to (its first two name parts)."""
    return ".".join(module.split(".")[:2])


def feature_breaches(package: str, modules: Mapping[str, Path] = MODULES, root: Path = ROOT) -> list[str]:
    """Every import by a module of ``package`` (one of OWNS) of a pipelines package OWNS does
    not give it, TYPE_CHECKING and functions included, as "file:line imports module"."""
    wrong = set()
    for module in (m for m in sorted(modules) if _under(m, package)):
        path = modules[module]
        where = path.relative_to(root) if path.is_relative_to(root) else path
        for line, name in module_imports(module, walked(path), modules):
            other = package_of_module(name)
            if (
                _under(name, "pipelines")
                and other not in {package, "pipelines"}
                and other not in OWNS[package]
            ):
                wrong.add(f"{where}:{line} imports {name}")
    return sorted(wrong)


@pytest.mark.parametrize("package", sorted(OWNS))
def test_no_package_imports_a_feature_it_does_not_own(package: str) -> None:
    pending = {other for owner, other in PENDING_FEATURE_IMPORTS if owner == package}
    wrong = feature_breaches(package)
    unexpected = [line for line in wrong if package_of_module(line.rpartition(" imports ")[2]) not in pending]
    assert unexpected == [], (
        f"{package} may import only {sorted(OWNS[package])} of pipelines' packages:\n" + "\n".join(unexpected)
    )
    still = {package_of_module(line.rpartition(" imports ")[2]) for line in wrong}
    assert pending <= still, (
        f"{package} no longer imports {sorted(pending - still)}: take it off PENDING_FEATURE_IMPORTS"
    )


def test_core_imports_no_feature_but_what_is_pending() -> None:
    """core's row gives it no feature; what it still imports is pending, and it is the cycle
    test_no_two_first_party_packages_import_each_other pins, nothing else (none now)."""
    assert not any(f"pipelines.{feature}" in OWNS["pipelines.core"] for feature in FEATURES)
    pinned = {PENDING_PACKAGE_CYCLE} if PENDING_PACKAGE_CYCLE else set()
    assert PENDING_FEATURE_IMPORTS == pinned


def test_every_package_has_a_row() -> None:
    packages = {package_of_module(m) for m in MODULES if m.startswith("pipelines.")} - {"pipelines"}
    assert packages == set(OWNS), "give each pipelines package its row in OWNS (and drop a gone one's)"


def test_the_package_rule_flags_a_module_importing_a_feature_it_does_not_own(tmp_path: Path) -> None:
    """The positive control: synthetic modules of core (a check, under TYPE_CHECKING; the rollout,
    in a function; the ledger relatively) and of triton (the store) are flagged at those lines;
    what the table gives them (core: storage, triton) is not."""
    modules = _synthetic(
        tmp_path,
        {
            "pipelines/core/sneaky.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from pipelines.checks.golden import G\n"
                "def f():\n    import pipelines.rollout.staged\nfrom ..ledger import chain\n"
                "from pipelines.storage.base import Repository\nfrom pipelines.triton import control\n"
                "from . import plan\n"
            ),
            "pipelines/core/plan.py": "import os\n",
            "pipelines/checks/golden.py": "import os\n",
            "pipelines/rollout/staged.py": "import os\n",
            "pipelines/ledger/chain.py": "import os\n",
            "pipelines/storage/base.py": "import os\n",
            "pipelines/triton/control.py": "from pipelines.storage import base\n",
        },
    )
    assert feature_breaches("pipelines.core", modules, tmp_path) == [
        "pipelines/core/sneaky.py:3 imports pipelines.checks.golden",
        "pipelines/core/sneaky.py:5 imports pipelines.rollout.staged",
        "pipelines/core/sneaky.py:6 imports pipelines.ledger.chain",
    ]
    assert feature_breaches("pipelines.triton", modules, tmp_path) == [
        "pipelines/triton/control.py:1 imports pipelines.storage.base"
    ]
    assert feature_breaches("pipelines.checks", modules, tmp_path) == []


@pytest.mark.parametrize("depth", range(1, DEPTH))
def test_no_two_first_party_packages_import_each_other(depth: int) -> None:
    found = cycles(package_graph(import_graph(), depth))
    pending = " <-> ".join(PENDING_PACKAGE_CYCLE) + ":\n"
    unexpected = [c for c in found if depth != 2 or not c.startswith(pending)]
    assert unexpected == [], f"import cycles between packages ({depth} name parts):\n" + "\n".join(found)
    if depth == 2 and PENDING_PACKAGE_CYCLE:
        assert len(found) == 1, f"the pending cycle is gone: empty PENDING_PACKAGE_CYCLE\n{found}"


def test_the_cycle_finder_sees_a_cycle_and_counts_type_checking() -> None:
    graph: Graph = {
        "a": {"b": "a:1 imports b"},
        "b": {"c": "b:2 imports c"},
        "c": {"a": "", "d": ""},
        "d": {},
    }
    assert sorted(strongly_connected(graph)) == [["a", "b", "c"], ["d"]]
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from mlreg.cli import main\nelse:\n    import registry.errors\n"
        "def f():\n    from pipelines.core import plan\n    from registry.contracts.config import X\n"
    )
    found = {name for _, name in module_imports("mlreg.service", ast.walk(ast.parse(source)))}
    assert found == {
        "mlreg.cli.main",
        "registry.errors",
        "pipelines.core.plan",
        "registry.contracts.config",
    }


def _synthetic(root: Path, files: dict[str, str]) -> dict[str, Path]:
    """Modules written under ``root`` (file path -> source), by dotted name (a package is its
    ``__init__``)."""
    modules = {}
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
        parts = path.relative_to(root).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def test_a_cycle_closed_under_type_checking_is_flagged(tmp_path: Path) -> None:
    """The positive control of the module rule, TYPE_CHECKING counted: ``register`` imports
    ``adapter`` only for its annotations, ``adapter`` imports ``register`` to run it."""
    modules = _synthetic(
        tmp_path,
        {
            "registry/mlflow/adapter.py": "from registry.mlflow import register\n",
            "registry/mlflow/register.py": (
                "from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from registry.mlflow.adapter import Adapter\n"
            ),
            "registry/mlflow/leaf.py": "import typing\n",
        },
    )
    found = cycles(import_graph(modules, tmp_path))
    assert found == [
        "registry.mlflow.adapter <-> registry.mlflow.register:\n"
        "  registry/mlflow/adapter.py:1 imports registry.mlflow.register\n"
        "  registry/mlflow/register.py:4 imports registry.mlflow.adapter"
    ]


def test_a_cycle_of_packages_with_no_cycle_of_modules_is_flagged(tmp_path: Path) -> None:
    """The positive control of the package rule: ``storage.base`` imports ``promote.plan`` and
    ``promote.runner`` imports ``storage.s3`` (under TYPE_CHECKING): no two modules close a cycle,
    the two packages do; a package's ``__init__`` importing its own modules is no cycle."""
    modules = _synthetic(
        tmp_path,
        {
            "pipelines/storage/base.py": "from pipelines.promote.plan import Plan\n",
            "pipelines/storage/s3.py": "import os\n",
            "pipelines/promote/plan.py": "import os\n",
            "pipelines/promote/runner.py": (
                "import typing\nif typing.TYPE_CHECKING:\n    from pipelines.storage import s3\n"
            ),
            "pipelines/promote/__init__.py": "from pipelines.promote.plan import Plan\n",
        },
    )
    graph = import_graph(modules, tmp_path)
    assert cycles(graph) == []
    assert cycles(package_graph(graph, 1)) == []
    assert cycles(package_graph(graph, 2)) == [
        "pipelines.promote <-> pipelines.storage:\n"
        "  pipelines/promote/runner.py:3 imports pipelines.storage.s3\n"
        "  pipelines/storage/base.py:1 imports pipelines.promote.plan"
    ]


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
        "from .. import errors\nfrom mlreg import service\ndef f():\n    import pipelines.triton.control\n"
    )
    found = sorted(first_party_imports("registry", tmp_path))
    assert found == [
        ("registry/contracts/upward.py:1", "registry"),
        ("registry/contracts/upward.py:2", "mlreg"),
        ("registry/contracts/upward.py:4", "pipelines"),
    ]
    assert [top for _, top in found if top not in ALLOWED["registry"]] == ["mlreg", "pipelines"]
