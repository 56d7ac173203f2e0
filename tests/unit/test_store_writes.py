"""Write-once store versions, ``mlreg store repair`` and ``verify --registered``, and the folder a
deployment's delete leaves behind -- on a real local-folder store (no server needed)."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from mlreg.cli.main import app
from pipelines.storage import open_store
from pipelines.storage.base import Repository
from pipelines.storage.local import LocalObjects
from pipelines.storage.push import push_model, push_path
from pipelines.storage.verify import MANIFEST
from registry.errors import StorageError
from registry.manifest import sha256_file
from registry.settings import Settings
from registry.signing import SIGNATURE_FILE, SIGNED_BY_TAG
from tests.cli import CliRunner
from tests.fakes import FakeRegistry

CONFIG = 'name: "m"\nbackend: "python"\n'


def model_folder(root: Path, files: dict[str, bytes] | None = None, name: str = "m") -> Path:
    folder = root / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(CONFIG.replace('"m"', f'"{name}"'))
    for rel, data in (files or {"model.py": b"print(1)\n", "sub/w.bin": b"w" * 3000}).items():
        (folder / "1" / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / "1" / rel).write_bytes(data)
    return folder


def shas(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (the store, its manifests and signatures included)."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def stored(tmp_path: Path) -> tuple[Repository, Path]:
    """``m`` v1 pushed, with a signature beside its manifest (as a promotion publishes it)."""
    store = open_store(tmp_path / "store")
    push_model(store, model_folder(tmp_path / "src"))
    store.objects.write(f"m/1/{SIGNATURE_FILE}", b'{"signed": "bundle"}')
    return store, tmp_path / "store"


# -- store push: a stored version is written once ------------------------------------------------


def test_a_push_of_other_bytes_over_a_stored_version_is_refused_and_changes_nothing(
    stored: tuple[Repository, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, root = stored
    before = shas(root)
    other = model_folder(
        tmp_path / "other", {"model.py": b"print(-1)\n", "sub/w.bin": b"w" * 3000, "x.py": b""}
    )
    with pytest.raises(StorageError, match=r"m v1 is already stored with other bytes") as refused:
        push_path(store, tmp_path / "other")
    was, now = (hashlib.sha256(data).hexdigest()[:12] for data in (b"print(1)\n", b"print(-1)\n"))
    assert refused.value.context["files"] == [
        f"model.py: other bytes (stored sha256 {was}..., pushed {now}...)",
        "x.py: not a file of the stored version",
    ]
    assert "register these bytes as a new version of m" in str(refused.value.fix)
    assert shas(root) == before  # bytes, manifest and signature: every file as it was
    # as a user types it: exit 5, the files named, the fix
    monkeypatch.setenv("MLREG_HOME", str(tmp_path / "home"))
    result = CliRunner().invoke(app, ["store", "push", str(other), "--store", str(root)])
    assert result.exit_code == 5, result.output
    assert f"error: {root}: m v1 is already stored with other bytes" in result.stderr
    assert "  model.py: other bytes (stored sha256" in result.stderr
    assert "fix: register these bytes as a new version of m ('mlreg register m FOLDER')" in result.stderr
    assert "Traceback" not in result.output
    assert shas(root) == before


def test_a_push_of_the_same_bytes_is_a_no_op_that_keeps_manifest_and_signature(
    stored: tuple[Repository, Path], tmp_path: Path
) -> None:
    store, root = stored
    before = shas(root)
    [again] = push_model(store, tmp_path / "src" / "m")
    assert (again.sent, again.skipped) == ([], ["model.py", "sub/w.bin"])
    assert shas(root) == before


def test_a_push_with_another_config_keeps_the_version_as_first_written(
    stored: tuple[Repository, Path], tmp_path: Path
) -> None:
    """The config is the model's desired state (written); the version's manifest keeps the config
    it was written with, so its digest stays the registered one."""
    store, root = stored
    manifest = (root / "m" / "1" / ".mlreg-manifest.json").read_bytes()
    config = tmp_path / "src" / "m" / "config.pbtxt"
    config.write_text(CONFIG + "max_batch_size: 4\n")
    [again] = push_model(store, tmp_path / "src" / "m")
    assert again.sent == []
    assert (root / "m" / "1" / ".mlreg-manifest.json").read_bytes() == manifest
    assert store.read_config("m") == config.read_text()


def test_a_push_of_the_same_bytes_puts_a_changed_stored_file_back(
    stored: tuple[Repository, Path], tmp_path: Path
) -> None:
    store, root = stored
    before = shas(root)
    (root / "m" / "1" / "model.py").write_bytes(b"print(2)\n")
    [again] = push_model(store, tmp_path / "src" / "m")
    assert again.sent == ["model.py"]
    assert shas(root) == before  # the first-written bytes; manifest and signature untouched


def test_a_push_takes_the_models_lock(stored: tuple[Repository, Path], tmp_path: Path) -> None:
    store, root = stored
    (tmp_path / "src" / "m" / "2").mkdir()
    (tmp_path / "src" / "m" / "2" / "model.py").write_text("print(2)\n")
    other = open_store(root)
    with other.session.lock("m", owner="promotion@elsewhere:1"):
        before = shas(root)
        with pytest.raises(StorageError, match="model 'm' is locked by promotion@elsewhere:1"):
            push_model(store, tmp_path / "src" / "m")
        assert {k: v for k, v in shas(root).items() if ".mlreg-lock." not in k} == {
            k: v for k, v in before.items() if ".mlreg-lock." not in k
        }
    push_model(store, tmp_path / "src" / "m")
    assert store.list_versions("m") == ["1", "2"]
    assert store.session.locks() == []  # released


class RacedObjects(LocalObjects):
    """A local folder on which ``racer`` runs just before this writer creates a manifest: another
    writer's whole upload of the same version lands between this one's files and its manifest."""

    def __init__(self, root: Path, racer: Callable[[], object]) -> None:
        super().__init__(root)
        self.racer: Callable[[], object] | None = racer

    def create(self, key: str, data: bytes) -> bool:
        if key.endswith(MANIFEST) and self.racer is not None:
            racer, self.racer = self.racer, None
            racer()
        return super().create(key, data)


@pytest.mark.parametrize("same", [False, True])
def test_of_two_writers_of_a_new_version_one_creates_it(tmp_path: Path, same: bool) -> None:
    """Two writers without the lock (e.g. an older mlreg): the manifest is created, never
    overwritten, so the second to create it is refused unless it stored the same bytes."""
    first = model_folder(tmp_path / "a", {"model.py": b"print('a')\n"})
    second = model_folder(tmp_path / "b", {"model.py": b"print('a')\n" if same else b"print('b')\n"})
    other = open_store(tmp_path / "store")
    store = Repository(
        RacedObjects(tmp_path / "store", lambda: other.versions.put_version("m", "1", second / "1"))
    )
    if same:
        assert store.versions.put_version("m", "1", first / "1").sent == ["model.py"]
    else:
        with pytest.raises(StorageError, match=r"m v1 was created by another writer while this push sent it"):
            store.versions.put_version("m", "1", first / "1")
    manifest = store.versions.read_manifest("m", "1")
    assert manifest is not None
    assert manifest.files["model.py"]["sha256"] == sha256_file(second / "1" / "model.py")  # the first made
    assert store.versions.check_version("m", "1", hashing="all").ok  # the other writer's version, whole


def test_a_repair_keeps_the_signature_beside_the_manifest(
    stored: tuple[Repository, Path], tmp_path: Path
) -> None:
    store, root = stored
    (root / "m" / "1" / "model.py").write_bytes(b"print(666)\n")
    store.versions.put_version("m", "1", tmp_path / "src" / "m" / "1")  # what a promotion's repair sends
    assert (root / "m" / "1" / SIGNATURE_FILE).read_bytes() == b'{"signed": "bundle"}'
    assert store.versions.verify_version("m", "1").ok


# -- mlreg store repair, mlreg store verify --registered (a registry stand-in) -------------------


@pytest.fixture
def registered(tmp_path: Path) -> tuple[FakeRegistry, Repository, Path]:
    """``m`` v1 registered (signed) and stored as registered, its signature beside the manifest."""
    registry = FakeRegistry(tmp_path / "registry")
    registry.add("m", "1", CONFIG)
    source = tmp_path / "registry" / "m" / "1"
    (source / "signature.sigstore.json").write_bytes(b'{"registered": "signature"}')
    registry.tags[("m", "1")][SIGNED_BY_TAG] = "key:abc"
    store = open_store(tmp_path / "store")
    store.versions.put_version("m", "1", source / "model", config=source / "config.pbtxt")
    store.session.write_config("m", CONFIG)
    store.objects.write(f"m/1/{SIGNATURE_FILE}", b'{"registered": "signature"}')
    assert store.versions.verify_version("m", "1", registry.tags[("m", "1")]["artifact_digest"]).ok
    return registry, store, tmp_path / "store"


def _settings(tmp_path: Path) -> Settings:
    return Settings.from_env(env={"MLREG_HOME": str(tmp_path / "home")})


def test_repair_puts_the_registered_bytes_back_and_keeps_the_signature(
    registered: tuple[FakeRegistry, Repository, Path], tmp_path: Path
) -> None:
    from mlreg.ops.store_repair import store_repair

    registry, store, root = registered
    before = shas(root)
    clean = store_repair(_settings(tmp_path), "m", "1", registry, store)
    assert (clean.repaired, clean.signature) == ("", "kept")
    assert clean.line() == f"{store.uri}: m/1 verifies: nothing to repair; signature kept"
    (root / "m" / "1" / "model.py").write_text("print('planted')\n")
    (root / "m" / "1" / "extra.py").write_text("import os\n")
    report = store_repair(_settings(tmp_path), "m", "1", registry, store)
    assert report.repaired.startswith("m/1 restored from the registry (")
    assert report.signature == "kept"
    after = shas(root)
    assert {k: after[k] for k in before if ".mlreg-manifest" not in k} == {
        k: v for k, v in before.items() if ".mlreg-manifest" not in k
    }
    assert set(after) == set(before)
    assert store.versions.verify_version("m", "1", registry.tags[("m", "1")]["artifact_digest"]).ok
    # a signature replaced in the store: MLflow's is put back
    store.objects.write(f"m/1/{SIGNATURE_FILE}", b"{}")
    assert store_repair(_settings(tmp_path), "m", "1", registry, store).signature == "put back from MLflow"
    assert (root / "m" / "1" / SIGNATURE_FILE).read_bytes() == b'{"registered": "signature"}'
    with pytest.raises(StorageError, match=r"m v7 is not in the store \(stored: 1\)"):
        store_repair(_settings(tmp_path), "m", "7", registry, store)


def test_verify_registered_flags_a_manifest_or_signature_changed_after_it_was_written(
    registered: tuple[FakeRegistry, Repository, Path], tmp_path: Path
) -> None:
    from mlreg.ops.store_verify import verify_registered

    registry, store, root = registered
    assert verify_registered(registry, store, "m", "1").ok
    store.objects.write(f"m/1/{SIGNATURE_FILE}", b'{"another": "signature"}')
    [problem] = verify_registered(registry, store, "m", "1").problems
    assert problem.line().startswith(
        ".mlreg-signature.json was changed after it was written: it differs from the signature "
        "registered in MLflow (expected sha256 "
    )
    store.objects.write(f"m/1/{SIGNATURE_FILE}", b'{"registered": "signature"}')
    # the whole version rewritten, its manifest consistent with the new bytes (an old push did this)
    (root / "m" / "1" / ".mlreg-manifest.json").unlink()
    (root / "m" / "1" / "model.py").write_text("print('other')\n")
    store.versions.put_version("m", "1", root / "m" / "1", config=root / "m" / "config.pbtxt")
    assert store.versions.verify_version("m", "1").ok  # consistent with itself...
    check = verify_registered(registry, store, "m", "1")
    assert [p.problem for p in check.problems] == ["digest"]  # ...but not what was registered
    assert check.problems[0].line().startswith(".mlreg-manifest.json does not match the digest registered")


def test_verify_registered_from_the_cli_without_mlflow_running(
    registered: tuple[FakeRegistry, Repository, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLREG_HOME", str(tmp_path / "home"))
    result = CliRunner().invoke(
        app, ["store", "verify", "m", "1", "--store", str(registered[2]), "--registered", "--digest", "x"]
    )
    assert result.exit_code == 2
    assert "error: --digest and --registered name the digest twice" in result.stderr


# -- a deployment's delete: the model's folder leaves the store ----------------------------------


def test_a_retired_models_folder_goes_to_the_archive(tmp_path: Path) -> None:
    from mlreg.ops.retire import clear_folder as _clear_folder

    store = open_store(tmp_path / "repo")
    folder = model_folder(tmp_path / "src")
    shutil.copytree(folder / "1", folder / "2")
    push_model(store, folder)
    (tmp_path / "repo" / "m" / "2" / ".mlreg-manifest.json").unlink()  # an upload that did not finish
    store.objects.delete("m/config.pbtxt")  # what the unload did first
    assert _clear_folder(store, "m") is None
    assert not (tmp_path / "repo" / "m").exists()
    assert store.list_models() == []
    archive = store.archive()
    assert archive.list_versions("m") == ["1"]
    assert archive.versions.verify_version("m", "1").ok
    assert json.loads((tmp_path / ".mlreg-archive" / "repo" / "m" / "1" / ".mlreg-manifest.json").read_text())
