"""The registry is its parts (issue 47 item 4): ``MlflowRegistry`` holds ``connection``, ``models``,
``runs`` and ``deployed`` and composes them (a derived version registered, one deleted with its
run); it forwards nothing to them, and no part is completed after it was made (the promotion
story is ``MlflowRuns``' constructor argument).  Callers take the part they use."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

from registry.mlflow import MlflowRegistry
from registry.mlflow.runs import MlflowRuns
from registry.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
ADAPTER = ROOT / "registry" / "mlflow" / "registry.py"


def _class(source: str, name: str) -> ast.ClassDef:
    return next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == name)


def _delegates(cls: ast.ClassDef) -> list[str]:
    """The methods whose body (past its docstring) is one call of a method of one of ``self``'s
    attributes, returned or not: a facade's forwarding."""
    found = []
    for node in cls.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        if len(body) != 1 or not isinstance(body[0], ast.Return | ast.Expr):
            continue
        value = body[0].value
        if isinstance(value, ast.Call):
            value = value.func
        if (
            isinstance(value, ast.Attribute)
            and isinstance(value.value, ast.Attribute)
            and isinstance(value.value.value, ast.Name)
            and value.value.value.id == "self"
        ):
            found.append(node.name)
    return found


def _completed_later(cls: ast.ClassDef) -> list[str]:
    """Assignments to an attribute of one of ``self``'s attributes (``self.runs.story = ...``)."""
    return [
        ast.unparse(target)
        for node in ast.walk(cls)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Attribute)
        and isinstance(target.value.value, ast.Name)
        and target.value.value.id == "self"
    ]


FACADE = textwrap.dedent(
    """
    class Facade:
        def __init__(self, runs):
            self.runs = runs
            self.runs.story = object()

        def aliases(self, name):
            '''forwarded'''
            return self.models.aliases(name)

        def record(self, *args):
            self.deployed.record(*args)

        def composed(self, name):
            found = self.models.version(name)
            self.runs.discard(found)
    """
)


def test_the_checks_see_a_delegate_and_a_part_completed_later() -> None:
    """The positive control: a facade that forwards and completes a part is caught."""
    facade = _class(FACADE, "Facade")
    assert _delegates(facade) == ["aliases", "record"]
    assert _completed_later(facade) == ["self.runs.story"]


def test_the_mlflow_registry_is_its_parts_and_what_composes_them() -> None:
    adapter = _class(ADAPTER.read_text(), "MlflowRegistry")
    methods = [n.name for n in adapter.body if isinstance(n, ast.FunctionDef)]
    assert methods == ["__init__", "register_version", "delete_version"]
    assert _delegates(adapter) == []
    assert _completed_later(adapter) == []


def test_each_part_is_made_whole_and_shares_the_one_connection(tmp_path: Path) -> None:
    registry = MlflowRegistry(Settings.from_env(env={"MLREG_HOME": str(tmp_path)}))
    story = registry.runs.story
    assert story.versions is registry.models  # the story reads the versions the registry reads
    assert registry.deployed.versions is registry.models
    assert registry.deployed.runs is registry.runs
    parts = (registry.models, registry.runs, registry.deployed, story)
    assert all(part.connection is registry.connection for part in parts)
    assert inspect.signature(MlflowRuns).parameters["story"].default is inspect.Parameter.empty
