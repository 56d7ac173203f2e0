"""The repository is its parts (issue 47 item 4): ``Repository`` holds an ``ObjectStore`` with its
``session`` and ``versions``, forwards nothing to them and subclasses nothing; the places beside a
repository (its archive, its ledger) are its objects' ``beside`` -- the same client, the archive
fenced by the repository's leases, the ledger journaled by no session (no undo takes one back)."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest

from pipelines.ledger import LEDGER, ledger_of
from pipelines.storage import base
from pipelines.storage.base import ARCHIVE, Repository
from pipelines.storage.objects import UNJOURNALED
from pipelines.storage.s3 import S3Objects
from tests.unit.ledger_fixtures import fields

PARTS = {"objects", "session", "versions"}


def delegates(source: str, name: str) -> list[str]:
    """The methods of class ``name`` in ``source`` whose body (past a docstring) only hands the call
    on to a part: ``return self.<part>.<same name>(...)`` or the same without ``return``, or a
    property returning ``self.<part>.<same name>``."""
    tree = ast.parse(textwrap.dedent(source))
    [cls] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    found = []
    for method in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
        body = [s for s in method.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        if len(body) != 1 or not isinstance(body[0], ast.Return | ast.Expr) or body[0].value is None:
            continue
        value = body[0].value
        target = value.func if isinstance(value, ast.Call) else value
        if (
            isinstance(target, ast.Attribute)
            and target.attr == method.name
            and isinstance(target.value, ast.Attribute)
            and target.value.attr in PARTS
            and isinstance(target.value.value, ast.Name)
            and target.value.value.id == "self"
        ):
            found.append(method.name)
    return found


def test_the_repository_forwards_nothing_to_its_parts_and_subclasses_nothing() -> None:
    source = inspect.getsource(base)
    assert delegates(source, "Repository") == ["uri"]  # its name only: where its objects are
    [cls] = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "Repository"]
    assert cls.bases == []  # no ObjectStore under it: no diamond with a backend's objects
    # the positive control: a facade of the old kind is named, method and property alike
    facade = """
        class Facade:
            def lock(self, model):
                \"\"\"Hold the lock.\"\"\"
                return self.session.lock(model)

            def delete_version(self, model, version):
                self.versions.delete_version(model, version)

            @property
            def leases(self):
                return self.session.leases

            def list_models(self):
                return sorted(self.objects.children(""))
    """
    assert delegates(facade, "Facade") == ["lock", "delete_version", "leases"]


def test_no_product_class_derives_from_the_repository() -> None:
    root = Path(base.__file__).resolve().parents[2]
    derived = [
        f"{path.relative_to(root)}:{node.lineno} {node.name}"
        for folder in ("pipelines", "mlreg", "registry")
        for path in sorted((root / folder).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and any(isinstance(b, ast.Name) and b.id in {"Repository", "RepositoryStore"} for b in node.bases)
    ]
    assert derived == []


def test_objects_belong_to_one_repository(tmp_path: Path) -> None:
    repo = Repository.local(tmp_path / "repo")
    assert repo.objects.journal is repo.session  # its writes are fenced and journaled by its session
    with pytest.raises(ValueError, match="belong to another repository"):
        Repository(repo.objects)  # a second session would journal none of the first one's writes


def test_the_archive_is_the_objects_beside_fenced_by_the_repository_s_leases(tmp_path: Path) -> None:
    repo = Repository.local(tmp_path / "home" / "repo")
    archive = repo.archive()
    assert archive.uri == str(tmp_path / "home" / ARCHIVE / "repo")
    assert archive.session.holder is repo.session  # a lost lock of the store fences the archive's copy
    assert archive.objects.journal is archive.session  # journaled by its own session
    assert archive.objects.digests is repo.objects.digests  # one digest cache: a copy's sha256 reused


def test_the_ledger_s_writes_are_in_no_session_s_journal(tmp_path: Path) -> None:
    repo = Repository.local(tmp_path / "repo")
    place, prefix = repo.objects.place_beside(LEDGER)
    assert (place.uri, prefix, place.journal) == (str(tmp_path / LEDGER / "repo"), "", UNJOURNALED)
    with repo.session.lock("scorer"):
        ledger_of(repo.objects).append(**fields())
    assert (tmp_path / LEDGER / "repo" / "head.json").is_file()
    assert repo.session.changed_keys == set()  # an undo of the promotion never takes an event back
    assert repo.objects.journal is repo.session  # the repository's own objects keep their journal


@pytest.mark.parametrize(
    ("prefix", "place", "keys"),
    [("models/staging", "models/.mlreg-ledger/staging", ""), ("", "", ".mlreg-ledger.")],
)
def test_an_s3_ledger_shares_the_store_s_client_and_no_journal(prefix: str, place: str, keys: str) -> None:
    """The ledger's objects beside the prefix (at a bucket's root: the root's objects, files named
    ``.mlreg-ledger.*``) go through the store's one client, never a copy of a private field."""
    repo = Repository(S3Objects("bucket", prefix, "http://127.0.0.1:9"))
    objects, key_prefix = repo.objects.place_beside(LEDGER)
    assert isinstance(objects, S3Objects)
    assert (objects.bucket, objects.prefix, key_prefix) == ("bucket", place, keys)
    assert objects._client is repo.objects._client  # one client: its credentials, its connections
    assert objects.journal is UNJOURNALED
    assert repo.objects.journal is repo.session
