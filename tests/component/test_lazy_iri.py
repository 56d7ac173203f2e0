"""pipelines/checks/lazy_iri.py: the IRI grammar is imported on first use, with the real answers."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines.checks import lazy_iri

REAL = """
import pathlib
import threading
import types
with open(pathlib.Path(__file__).with_suffix(".imports"), "a") as log:
    log.write("imported\\n")  # one line per import of the module
CALLS = []
def is_valid_syntax(term, value):
    CALLS.append((term, value, threading.get_ident()))
    return value.startswith("http")
OTHER = "the real one's name"
"""


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A package of its own standing in for rfc3987_syntax (the real one builds its grammar on import)."""
    name = f"mlreg_fake_iri_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(REAL)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(lazy_iri, "PACKAGE", name)
    yield name
    sys.modules.pop(name, None)


def imports(module: types.ModuleType) -> int:
    return len(Path(str(module.__file__)).with_suffix(".imports").read_text().splitlines())


def test_the_package_is_imported_at_its_first_use_and_answers_as_itself(package: str) -> None:
    assert lazy_iri.defer() is True
    stand_in = sys.modules[package]
    exec(f"from {package} import is_valid_syntax", namespace := {})  # as jsonschema imports it
    assert isinstance(stand_in, lazy_iri._Deferred)  # nothing imported yet
    check = namespace["is_valid_syntax"]
    assert check("iri", "http://example.com/a") is True
    assert check("iri", "no scheme") is False
    real = sys.modules[package]
    assert real is not stand_in  # the real package took its place
    assert imports(real) == 1
    assert [(term, value) for term, value, _ in real.CALLS] == [
        ("iri", "http://example.com/a"),
        ("iri", "no scheme"),
    ]
    assert stand_in.OTHER == "the real one's name"  # any other name: the real package's
    assert lazy_iri.defer() is False  # imported already: nothing to do


def test_threads_checking_at_once_import_the_package_once(package: str) -> None:
    lazy_iri.defer()
    stand_in = sys.modules[package]
    answers: list[bool] = []
    threads = [
        threading.Thread(target=lambda: answers.append(stand_in.is_valid_syntax("iri", "http://x")))
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert answers == [True] * 8
    assert imports(sys.modules[package]) == 1


def test_nothing_is_deferred_where_the_package_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lazy_iri, "PACKAGE", "mlreg_no_such_package_anywhere")
    assert lazy_iri.defer() is False
    assert "mlreg_no_such_package_anywhere" not in sys.modules


def test_jsonschema_registers_its_iri_checks_without_building_the_grammar() -> None:
    """In a fresh interpreter, where the real rfc3987_syntax is installed (the dev extras)."""
    if importlib.util.find_spec("rfc3987_syntax") is None:  # not imported here: that is the 2 s
        pytest.skip("rfc3987_syntax is not installed (the dev extras install it)")
    code = (
        "import sys\n"
        "from pipelines.checks import lazy_iri\n"
        "assert lazy_iri.defer()\n"
        "from jsonschema import FormatChecker\n"
        "assert 'rfc3987_syntax.syntax_helpers' not in sys.modules\n"
        "print(sorted(f for f in FormatChecker.checkers if f.startswith('iri')))\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["['iri',", "'iri-reference']"]
