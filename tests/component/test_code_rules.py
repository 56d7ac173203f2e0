"""The code's size and shape rules, read from the source (``ast`` and radon; nothing imported).

- Cyclomatic complexity, counted as radon counts it (``radon.complexity``: boolean operators and
  comprehension branches too, which ruff's mccabe leaves out), at most 15 for every function,
  method and closure of ``mlreg``, ``registry`` and ``pipelines``.
- No module of ``mlreg/cli/`` over 200 lines; no class over 300 lines anywhere in ``mlreg``,
  ``registry`` and ``pipelines`` (one still over it would be pinned in ``PENDING_LONG_CLASSES``,
  which fails once it fits; none is).
- A function-local import says why it is local: one of a first-party module carries a
  ``# lazy: <why>`` comment on its line (for an import written over several lines, the line of
  its closing parenthesis will do); one of a heavy third-party module (``HEAVY``) carries a
  ``# lazy:`` comment that names the import time it saves (``~0.3 s``, ``120 ms``).

Each rule has a positive control: a synthetic source breaking it is flagged, one keeping it is not.
``/tmp/tools/lazy_report.py`` prints the function-local imports this file's rule flags.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from radon.complexity import cc_visit_ast

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = ("mlreg", "registry", "pipelines")
MAX_COMPLEXITY = 15
MAX_CLI_MODULE_LINES = 200
CLI = ("mlreg/cli",)
MAX_CLASS_LINES = 300
# classes still over MAX_CLASS_LINES, each exactly as the rule finds it but for its length: a class
# joining them fails, and one that fits again must be taken off (the test says so).  Empty: the two
# issue 47 item 6 found (Fleet and Headroom) are split by responsibility into composed parts
# (pipelines/fleet: view, sender, admission, recreations, putback; pipelines/guards/headroom.py and
# its parts), so any class over the limit now fails.
PENDING_LONG_CLASSES: set[str] = set()
# third-party modules (and their submodules) whose import costs enough to be put off: a
# function-local import of one names the time it saves
HEAVY = (
    "tensorflow",
    "keras",
    "tf2onnx",
    "onnx",
    "onnxruntime",
    "mlflow",
    "boto3",
    "botocore",
    "tritonclient",
    "pytriton",
    "numpy",
    "pandas",
    "great_expectations",
    "matplotlib",
    "PIL",
    "sqlalchemy",
    "yaml",
    "requests",
    "grpc",
    "google.protobuf",
    "typer",
    "click",
    "rich",
    "pydantic",
    "model_signing",
    "sigstore",
    "cryptography",
    "jsonschema",
    "psutil",
)
LAZY = re.compile(r"#\s*lazy:\s*(?P<why>\S.*)")
# an import time: a figure with a unit ("~0.3 s", "120 ms", "1s", "0.5 seconds")
IMPORT_TIME = re.compile(r"\d+(?:\.\d+)?\s?(?:ms|s|sec|secs|seconds?)\b")


def python_files(root: Path, folders: tuple[str, ...]) -> list[Path]:
    return sorted(path for folder in folders for path in (root / folder).rglob("*.py"))


@functools.cache
def source(path: Path) -> str:
    return path.read_text(encoding="utf-8")


@functools.cache
def parse(path: Path) -> ast.Module:
    return ast.parse(source(path), filename=str(path))


def where(path: Path, line: int, root: Path) -> str:
    shown = path.relative_to(root) if path.is_relative_to(root) else path
    return f"{shown}:{line}"


# -- complexity --------------------------------------------------------------------------------


def functions(
    node: ast.AST, prefix: str = ""
) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """(qualified name, node) of every function under ``node``: methods, closures, and the
    functions of classes defined in functions too."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            yield f"{prefix}{child.name}", child
            yield from functions(child, f"{prefix}{child.name}.")
        elif isinstance(child, ast.ClassDef):
            yield from functions(child, f"{prefix}{child.name}.")
        else:
            yield from functions(child, prefix)


def complexity(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """radon's cyclomatic complexity of ``function`` alone (a closure is a block of its own:
    radon leaves its branches out of the enclosing function's count)."""
    (block,) = cc_visit_ast(ast.Module(body=[function], type_ignores=[]))
    return int(block.complexity)


def too_complex(files: list[Path], root: Path = ROOT, limit: int = MAX_COMPLEXITY) -> list[str]:
    """Every function over ``limit``, as "file:line name complexity"."""
    found = []
    for path in files:
        for name, node in functions(parse(path)):
            score = complexity(node)
            found += [f"{where(path, node.lineno, root)} {name} {score}"] if score > limit else []
    return found


def test_every_function_is_at_most_15_complex_as_radon_counts() -> None:
    found = too_complex(python_files(ROOT, FIRST_PARTY))
    assert found == [], (
        f"{len(found)} function(s) over a radon complexity of {MAX_COMPLEXITY} "
        "(split them; `radon cc -s FILE` prints each function's count):\n" + "\n".join(found)
    )


BRANCHY = "\n".join(
    [
        "def simple(a):",
        "    return a or 1",
        "class Store:",
        "    def branchy(self, a, b):",
        *(f"        if a == {n} and b:\n            return {n}" for n in range(8)),  # 1 + 8 * 2 = 17
        "        def inner(x):",
        *(f"            if x == {n}:\n                return {n}" for n in range(15)),  # 16
        "        return inner",
        "    def fifteen(self, a):",
        *(f"        if a == {n}:\n            return {n}" for n in range(14)),  # 15
    ]
)


def test_the_complexity_rule_flags_a_branchy_method_and_closure(tmp_path: Path) -> None:
    """The positive control: boolean operators count (mccabe's 9 is radon's 17), a closure is
    measured on its own, and 15 is allowed."""
    (tmp_path / "branchy.py").write_text(BRANCHY + "\n")
    assert too_complex([tmp_path / "branchy.py"], tmp_path) == [
        "branchy.py:4 Store.branchy 17",
        "branchy.py:21 Store.branchy.inner 16",
    ]


# -- sizes ---------------------------------------------------------------------------------------


def long_modules(files: list[Path], root: Path = ROOT, limit: int = MAX_CLI_MODULE_LINES) -> list[str]:
    return [
        f"{where(path, 1, root)} {lines} lines"
        for path in files
        if (lines := len(source(path).splitlines())) > limit
    ]


def long_classes(files: list[Path], root: Path = ROOT, limit: int = MAX_CLASS_LINES) -> list[str]:
    found = []
    for path in files:
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                found += (
                    [f"{where(path, node.lineno, root)} {node.name} {lines} lines"] if lines > limit else []
                )
    return found


def test_no_cli_module_is_over_200_lines() -> None:
    found = long_modules(python_files(ROOT, CLI))
    assert found == [], f"modules of {', '.join(CLI)} over {MAX_CLI_MODULE_LINES} lines:\n" + "\n".join(found)


def test_no_class_is_over_300_lines() -> None:
    found = long_classes(python_files(ROOT, FIRST_PARTY))
    named = {f"{line.split(':')[0]} {line.split()[1]}" for line in found}
    unexpected = [
        line for line in found if f"{line.split(':')[0]} {line.split()[1]}" not in PENDING_LONG_CLASSES
    ]
    assert unexpected == [], (
        f"classes over {MAX_CLASS_LINES} lines (split them; do not raise the limit):\n"
        + "\n".join(unexpected)
    )
    assert PENDING_LONG_CLASSES <= named, (
        f"{sorted(PENDING_LONG_CLASSES - named)} fit now: take them off PENDING_LONG_CLASSES"
    )


def test_the_size_rules_flag_a_long_module_and_a_long_class(tmp_path: Path) -> None:
    (tmp_path / "long.py").write_text("x = 1\n" * 201)
    (tmp_path / "short.py").write_text("x = 1\n" * 200)
    method_body, nested_body = "    x = 1\n", "        x = 1\n"
    (tmp_path / "classes.py").write_text(
        f"class Fits:\n{method_body * 299}\ndef f():\n    class Nested:\n{nested_body * 300}"
    )
    assert long_modules([tmp_path / "long.py", tmp_path / "short.py"], tmp_path) == ["long.py:1 201 lines"]
    assert long_classes([tmp_path / "classes.py"], tmp_path) == ["classes.py:303 Nested 301 lines"]


# -- function-local imports ----------------------------------------------------------------------


@dataclass(frozen=True)
class LocalImport:
    """A function-local import that lacks the comment its kind needs."""

    where: str
    text: str  # the statement, on one line
    heavy: bool  # a heavy third-party module: the comment must name an import time

    def __str__(self) -> str:
        return f"{self.where}: {self.text}"


def comment(path: Path, line: int) -> str:
    """The comment on ``line`` of an import statement (whose own text holds no string: the
    first ``#`` on one of its lines starts the comment)."""
    text = lines_of(path)[line - 1]
    return text[text.index("#") :] if "#" in text else ""


@functools.cache
def lines_of(path: Path) -> list[str]:
    return source(path).splitlines()


def imported_modules(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The absolute names an import statement names (a relative one: ``.``, first party)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    return ["." if node.level else (node.module or "")]


def _is(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def local_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement inside a function (in its ``if``/``try`` blocks and closures too)."""
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            for statement in function.body:  # a closure's are its own: walked when it is
                yield from _imports_outside_functions(statement)


def _imports_outside_functions(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
    elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        for child in ast.iter_child_nodes(node):
            yield from _imports_outside_functions(child)


def unexplained_imports(files: list[Path], root: Path = ROOT) -> list[LocalImport]:
    """The function-local imports of first-party modules with no ``# lazy: <why>`` and of heavy
    third-party ones with no ``# lazy:`` naming an import time (the comment on the statement's
    first or last line)."""
    found = []
    for path in files:
        for node in sorted(local_imports(parse(path)), key=lambda node: node.lineno):
            names = imported_modules(node)
            heavy = any(_is(name, HEAVY) for name in names)
            if not heavy and not any(name == "." or _is(name, FIRST_PARTY) for name in names):
                continue  # the standard library and light packages: no rule
            lines = {node.lineno, node.end_lineno or node.lineno}
            whys = [m["why"] for line in sorted(lines) if (m := LAZY.search(comment(path, line)))]
            if not whys or (heavy and not any(IMPORT_TIME.search(why) for why in whys)):
                found.append(LocalImport(where(path, node.lineno, root), ast.unparse(node), heavy))
    return found


def test_every_function_local_import_says_why() -> None:
    found = unexplained_imports(python_files(ROOT, FIRST_PARTY))
    first_party = [str(item) for item in found if not item.heavy]
    heavy = [str(item) for item in found if item.heavy]
    assert found == [], (
        f"{len(first_party)} function-local first-party import(s) without `# lazy: <why>`:\n"
        + "\n".join(first_party)
        + f"\n{len(heavy)} function-local heavy import(s) without `# lazy:` naming the import time "
        "it saves (`~0.3 s`, `120 ms`):\n" + "\n".join(heavy)
    )


LOCAL_IMPORTS = """\
import numpy
from pipelines import storage


def f():
    import os
    import json  # lazy: not needed, not checked
    from registry.settings import Settings
    from registry.errors import MlregError  # lazy: the errors module pulls protobuf
    from . import sibling  # lazy:
    from pipelines.storage import (  # lazy: on the first line
        open_store,
    )
    from pipelines.core import (
        plan,
    )  # lazy: on the closing line
    from mlreg.ops import (
        status,
        history,
    )
    if os.environ:
        import boto3  # lazy: ~0.3 s of import time a local store never pays
        import botocore.exceptions  # lazy: botocore is heavy
        from google.protobuf import text_format  # lazy: protobuf loads with the schema
        import yaml, os  # lazy: 15 ms
        import mlflow  # lazy: MLflow costs ~1 s of import time

    def inner():
        import numpy as np  # lazy: 120ms
        from tritonclient.utils import triton_to_np_dtype
        return np, triton_to_np_dtype

    class Local:
        def method(self):
            import pandas  # lazy: seconds of import
            from .. import errors
"""


def test_the_import_rule_flags_each_local_import_that_does_not_say_why(tmp_path: Path) -> None:
    """The positive control: module-level imports and the standard library are left alone; an
    empty ``# lazy:`` is no reason; the comment may sit on the first or the closing line; a heavy
    module's reason must name a time; closures and methods of local classes are read too."""
    (tmp_path / "local.py").write_text(LOCAL_IMPORTS)
    found = unexplained_imports([tmp_path / "local.py"], tmp_path)
    assert [(str(item), item.heavy) for item in found] == [
        ("local.py:8: from registry.settings import Settings", False),
        ("local.py:10: from . import sibling", False),
        ("local.py:17: from mlreg.ops import status, history", False),
        ("local.py:23: import botocore.exceptions", True),
        ("local.py:24: from google.protobuf import text_format", True),
        ("local.py:30: from tritonclient.utils import triton_to_np_dtype", True),
        ("local.py:35: import pandas", True),
        ("local.py:36: from .. import errors", False),
    ]
