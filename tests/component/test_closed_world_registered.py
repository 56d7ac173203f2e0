"""Issue 44, review round (H1b): a load names only bytes the *registry* knows, and the config names no
file mlreg cannot cover.

- F2: a version folder nobody registered, with a hand-made manifest (it parses, it lists every
  file) and named in the store's config, rode into every load of the next promotion as "verified".
  Now a version a load names must have been held to MLflow's ``artifact_digest`` in this run
  (``verify_load``); without one it is refused, or -- the way back, with ``--no-way-back`` -- never
  named by a load.  The undo log, retention's bring-back and ``status`` say the same.
- F3/F9: ``label_filename``, ``initial_state.data_file`` and parameters naming files are refused by
  ``validate`` (an allow-list: only the python backend's EXECUTION_ENV_PATH may name a file).
- F4: a folder mlreg cannot list is an entry that refuses the load, never skipped.
- F8: ``store push`` refuses ``09/`` before anything is sent.
- Variant verbs: retention's bring-back refuses a planted entry (``mlreg deployments``: in
  tests/integration/test_closed_world_verbs.py, since the plugin imports MLflow).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from pipelines.core.plan import Role, Step, serving_versions
from pipelines.core.reports import PromotionFailed
from pipelines.promote import retention
from pipelines.promote.integrity import unregistered_problems, verifier
from pipelines.storage import open_store
from pipelines.storage.local import walk_model
from pipelines.storage.manifest import MANIFEST, Manifest
from pipelines.storage.push import push_model
from registry.contracts.validate import validate_path
from registry.errors import StorageError
from tests.unit.worlds import MEMBER, World

TEMPLATE = Path(__file__).resolve().parents[2] / "model_repository_template"


def _deployed(tmp_path: Path) -> World:
    world = World(tmp_path)
    world.promote("ens", "1")
    world.registry.add("net", "2", MEMBER.format(name="net", src="MID", dst="OUT"))
    world.events.clear()
    return world


def _plant_foreign(world: World, version: str = "77") -> str:
    """The reviewer's plant: ``net/<version>/`` with its own model.py and a manifest written by hand
    (no registry involved), added to the store's config -- the one entry nobody checks."""
    root = world.store_root / "net"
    (root / version).mkdir()
    source = (root / "1" / "model.py").read_text() + "\nprint('PLANTED')\n"
    (root / version / "model.py").write_text(source)
    manifest = Manifest.of_folder({"model.py": root / version / "model.py"})
    (root / version / MANIFEST).write_text(manifest.to_json())
    config = (root / "config.pbtxt").read_text()
    (root / "config.pbtxt").write_text(config.replace("versions: 1", f"versions: 1\n    versions: {version}"))
    return manifest.digest


def _net_loads(world: World) -> list[tuple[str, ...]]:
    return [versions for _, _, model, versions in world.loads() if model == "net"]


# -- F2: a manifest the registry does not know ------------------------------------------------------


def test_a_version_folder_nobody_registered_refuses_the_promotion_and_is_never_loaded(tmp_path: Path) -> None:
    world = _deployed(tmp_path)
    _plant_foreign(world)
    before = world.config("net")
    with pytest.raises(
        PromotionFailed, match=r"net v77 in .* cannot be verified: MLflow records no artifact_digest"
    ):
        world.promote("net", "2")
    assert world.loads() == []  # nothing sent to any replica
    assert world.config("net") == before  # the store as it was
    assert not (world.store_root / "net" / "2").exists()
    # --no-way-back: promoted, but no load ever names the unregistered v77 (nor is it kept)
    result = world.promote("net", "2", no_way_back=True)
    assert result.ok
    loads = _net_loads(world)
    assert loads != []
    assert all("77" not in versions for versions in loads), loads
    assert serving_versions(world.config("net")) == ["2"]


def test_a_load_naming_a_version_never_held_to_mlflows_digest_is_refused(tmp_path: Path) -> None:
    world = _deployed(tmp_path)
    _plant_foreign(world)
    store = open_store(world.store_root)
    digest = world.registry.models.version_tags("net", "1")["artifact_digest"]
    store.versions.verify_version("net", "1", digest)  # v1 held to MLflow's digest; v77 never can be
    assert store.versions.check_version("net", "77").status == "verified"  # self-consistent: proves nothing
    with pytest.raises(
        StorageError, match=r"net v77 was not checked in this run against a digest registered"
    ):
        store.versions.verify_load("net", ("1", "77"))
    config = world.config("net")
    assert config is not None
    assert serving_versions(config) == ["1", "77"]
    with pytest.raises(StorageError, match=r"net v77 was not checked"):
        store.versions.verify_load("net", ("1",), config)  # the config's version_policy names v77 too
    store.versions.verify_load("net", ("1",))  # the registered one alone loads


def test_the_undo_and_retentions_bring_back_never_fall_back_to_the_manifest_alone(tmp_path: Path) -> None:
    world = _deployed(tmp_path)
    _plant_foreign(world)
    store = open_store(world.store_root)
    verify = verifier(store, {})  # the undo log, for a version MLflow records no digest of
    assert "cannot be verified: MLflow records no artifact_digest" in verify("net", "77")
    step = Step("net", "77", Role.MEMBER, None, "", None, [], digest="")
    assert retention.restored(store, step) is False  # uploaded from the registry instead, never trusted
    assert (world.store_root / "net" / "77" / "model.py").exists()  # and nothing of ours deleted


def test_status_names_a_version_folder_whose_manifest_the_registry_does_not_know(tmp_path: Path) -> None:
    world = _deployed(tmp_path)
    _plant_foreign(world)
    store = open_store(world.store_root)
    world.registry.tags[("net", "77")] = {}  # known to MLflow, with no digest
    lines = unregistered_problems(store, world.registry, "net")
    assert [
        line for line in lines if line.startswith("net/77/ has a manifest the registry does not know")
    ] != []
    world.registry.tags[("net", "77")] = {"artifact_digest": "0" * 64}  # another digest
    assert [line for line in unregistered_problems(store, world.registry, "net") if "net/77/" in line] != []
    assert not [line for line in lines if line.startswith("net/1/")]  # the registered one is not named


# -- F3 / F9: files a config names ------------------------------------------------------------------


def _errors(tmp_path: Path, model: str, old: str, new: str) -> list[str]:
    repo = tmp_path / "repo"
    if not repo.exists():
        shutil.copytree(TEMPLATE, repo)
    path = repo / model / "config.pbtxt"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    return [f.message for f in validate_path(repo).findings if f.is_error and f.rule == "paths"]


def test_the_templates_configs_name_no_file_mlreg_cannot_cover(tmp_path: Path) -> None:
    shutil.copytree(TEMPLATE, tmp_path / "repo")
    assert [f.message for f in validate_path(tmp_path / "repo").findings if f.rule == "paths"] == []


@pytest.mark.parametrize(
    ("label", "message"),
    [
        ("../../../../../etc/passwd", "label_filename '../../../../../etc/passwd' leaves the model folder"),
        ("labels.txt", "label_filename 'labels.txt' names a file"),
    ],
)
def test_a_label_file_is_refused_at_validate(tmp_path: Path, label: str, message: str) -> None:
    config = (TEMPLATE / "image_preprocess" / "config.pbtxt").read_text()
    first_output = config.index("output")
    name_at = config.index("name:", first_output)
    line_end = config.index("\n", name_at)
    old = config[name_at:line_end]
    errors = _errors(tmp_path, "image_preprocess", old, f'{old}\n    label_filename: "{label}"')
    assert [e for e in errors if message in e] != [], errors


def test_an_initial_state_data_file_is_refused_at_validate(tmp_path: Path) -> None:
    from registry.contracts.config import parse_config
    from registry.contracts.file_refs import check_config_files

    config = parse_config(
        'name: "s"\nbackend: "python"\nmax_batch_size: 1\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'sequence_batching { state [ { input_name: "IN_S" output_name: "OUT_S" data_type: TYPE_FP32 '
        'dims: [ 1 ] initial_state: [ { name: "init" data_type: TYPE_FP32 dims: [ 1 ] '
        'data_file: "../../../../etc/hostname" } ] } ] }\n'
    )
    found = [f.message for f in check_config_files("s", config)]
    assert len(found) == 1
    assert "data_file '../../../../etc/hostname' leaves the model folder" in found[0]


@pytest.mark.parametrize(
    ("model", "old", "parameter", "message"),
    [
        (  # OpenVINO dlopens it: a known path key, refused whatever its value
            "image_model",
            'default_model_filename: "model"',
            'parameters { key: "CPU_EXTENSION_PATH" value { string_value: "libevil.so" } }',
            "parameter CPU_EXTENSION_PATH 'libevil.so' is a file",
        ),
        (  # an unknown key with a path
            "table_data_preprocess",
            'backend: "python"',
            'parameters { key: "EXTENSION_LIB" value { string_value: "/tmp/evil.so" } }',
            "parameter EXTENSION_LIB '/tmp/evil.so' leaves the version folder",
        ),
        (  # an unknown key with a file name
            "table_data_preprocess",
            'backend: "python"',
            'parameters { key: "LIB" value { string_value: "libevil.so" } }',
            "parameter LIB 'libevil.so' names a file",
        ),
        (  # an execution accelerator's parameter: onnxruntime's TensorRT provider reads its cache there
            "table_data_model",
            'platform: "onnxruntime_onnx"',
            'optimization { execution_accelerators { gpu_execution_accelerator: [ { name: "tensorrt" '
            'parameters { key: "trt_engine_cache_path" value: "/tmp/cache" } } ] } }',
            "gpu_execution_accelerator 'tensorrt' parameter trt_engine_cache_path '/tmp/cache' is a file",
        ),
        (  # EXECUTION_ENV_PATH is the python backend's: elsewhere it names a file nobody reads
            "image_model",
            'default_model_filename: "model"',
            'parameters { key: "EXECUTION_ENV_PATH" value { string_value: '
            '"$$TRITON_MODEL_DIRECTORY/1/e.tgz" } }',
            "parameter EXECUTION_ENV_PATH '$$TRITON_MODEL_DIRECTORY/1/e.tgz' is read only by the python",
        ),
    ],
)
def test_a_parameter_naming_a_file_is_refused_unless_the_allow_list_holds_it(
    tmp_path: Path, model: str, old: str, parameter: str, message: str
) -> None:
    errors = _errors(tmp_path, model, old, f"{old}\n{parameter}")
    assert [e for e in errors if message in e] != [], errors


def test_the_allow_list_keeps_the_python_backends_environment_and_plain_values(tmp_path: Path) -> None:
    parameters = (
        'backend: "python"\nparameters { key: "EXECUTION_ENV_PATH" value { string_value: '
        '"$$TRITON_MODEL_DIRECTORY/1/env.tar.gz" } }\n'
        'parameters { key: "threshold" value { string_value: "0.5" } }\n'
        'parameters { key: "mode" value { string_value: "fast" } }'
    )
    assert _errors(tmp_path, "table_data_preprocess", 'backend: "python"', parameters) == []


# -- F4: what mlreg cannot list ---------------------------------------------------------------------


def test_a_folder_mlreg_cannot_list_is_an_entry_never_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fake for a fault the suite cannot provoke for real: it runs as root, which lists any folder
    whatever its mode; os.scandir refuses one folder as it would for a user mlreg runs as."""
    store = open_store(tmp_path / "store")
    folder = tmp_path / "src" / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text("X = 1\n")
    (folder / "config.pbtxt").write_text('name: "m"\nbackend: "python"\n')
    push_model(store, folder)
    hidden = tmp_path / "store" / "m" / "helpers"
    hidden.mkdir()
    (hidden / "__init__.py").write_text("print('PLANTED')\n")
    real = os.scandir

    def scandir(path: Any = ".") -> Any:
        if not isinstance(path, int) and Path(path) == hidden:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    _, odd = walk_model(tmp_path / "store" / "m", "m")
    assert [rel for rel, why in odd if "cannot be listed by mlreg" in why] == ["helpers/"]
    with pytest.raises(StorageError, match=r"m/helpers/ cannot be listed by mlreg"):
        store.versions.verify_version("m", "1")
    version = tmp_path / "store" / "m" / "1"
    shutil.rmtree(hidden)
    (version / "sub").mkdir()
    hidden = version / "sub"
    with pytest.raises(StorageError, match=r"cannot guard m/1/ against bytecode caches"):
        store.objects.guard_bytecode("m", "1")  # a StorageError, never a raw PermissionError


# -- F8: a version folder Triton would not load as that version -----------------------------------------


def test_store_push_refuses_a_version_folder_with_a_leading_zero_before_anything_is_sent(
    tmp_path: Path,
) -> None:
    store = open_store(tmp_path / "store")
    folder = tmp_path / "src" / "m"
    for name in ("9", "09"):
        (folder / name).mkdir(parents=True)
        (folder / name / "model.py").write_text("X = 1\n")
    (folder / "config.pbtxt").write_text('name: "m"\nbackend: "python"\n')
    with pytest.raises(StorageError, match=r"09/ with a leading zero .* Triton 2.51 ignores such a folder"):
        push_model(store, folder)
    assert store.objects.list_prefix("m/") == []  # nothing sent, not even v9
    with pytest.raises(StorageError, match=r"version '09' is not a number Triton loads"):
        store.versions.put_version("m", "09", folder / "09")
    assert store.objects.list_prefix("m/") == []


# -- variant verbs: deployments, retention's bring-back ---------------------------------------------


def test_retentions_bring_back_refuses_a_version_whose_model_folder_holds_a_planted_entry(
    tmp_path: Path,
) -> None:
    """v1 archived, then brought back by retention for a promotion: with the promote test's plant
    (``net/1.py``) beside the version folders it is not restored (the load would be refused); the
    same bring-back without the plant restores it (the positive control)."""
    from pipelines.storage.archive import archive_of, move_to_archive

    world = _deployed(tmp_path)
    world.promote("net", "2")
    store = open_store(world.store_root)
    archive = archive_of(store)
    move_to_archive(store, archive, "net", "1")
    assert store.versions.read_manifest("net", "1") is None
    digest = world.registry.models.version_tags("net", "1")["artifact_digest"]
    step = Step("net", "1", Role.MEMBER, None, "", None, [], digest=digest)
    (world.store_root / "net" / "1.py").write_text("print('PLANTED')\n")
    assert retention.restored(store, step) is False
    (world.store_root / "net" / "1.py").unlink()
    store.versions.delete_version("net", "1")
    assert retention.restored(open_store(world.store_root), step) is True  # the control
    assert (
        retention.restored(open_store(world.store_root), Step("net", "1", Role.MEMBER, None, "", None, []))
        is False
    )


def test_store_verify_registered_names_a_version_without_mlflows_digest(tmp_path: Path) -> None:
    from mlreg.ops.store_verify import verify_registered

    world = _deployed(tmp_path)
    _plant_foreign(world)
    store = open_store(world.store_root)
    world.registry.tags[("net", "77")] = {}  # known to MLflow, with no digest
    check = verify_registered(world.registry, store, "net", "77")  # type: ignore[arg-type]
    assert not check.ok
    assert [p.problem for p in check.problems] == ["digest"]
    assert "a load naming it is refused" in check.note
    assert verify_registered(world.registry, store, "net", "1").ok  # type: ignore[arg-type]
