"""Registering a model version in MLflow: artifacts, signature, manifest, lineage, validation.

Every exported version (ONNX, SavedModel, python-backend code, ensemble wiring) becomes one
MLflow run (params, metrics, artifacts) and one registered model version whose tags carry the
lineage.  Registering identical bytes again returns the existing version unless ``force``.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from registry.contracts.checks import check_artifacts, read_signature
from registry.contracts.config import CONFIG_NAME, load_config
from registry.contracts.repository import ModelEntry
from registry.contracts.rules import PATHS_RULE, check_model, kind, model_file
from registry.disk import cleaned_up, disk_full_error, is_disk_full, local_path
from registry.errors import ContractError, MlregError, RegistryError
from registry.lineage import (
    Lineage,
    contract_of,
    describe,
    digest_of_contract,
    flavors_of,
    git_state,
    tensor_specs,
)
from registry.logged_model import LoggedTritonModel
from registry.manifest import CONFIG_ENTRY, digest_of_manifest, manifest_of, sha256_file
from registry.ports import Registrar, Signatory
from registry.settings import EXPORTS_EXPERIMENT
from registry.signing import (
    SIGNATURE_ARTIFACT,
    SIGNED_BY_TAG,
    SignatureError,
    SigningKey,
    claimed_identity,
    sign,
    signed_files,
)

log = logging.getLogger(__name__)
MODEL_NAME = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.\-_]*$")
FRAMEWORKS = {
    "onnxruntime_onnx": "onnx",
    "tensorflow_savedmodel": "tensorflow",
    "python": "python",
    "ensemble": "ensemble",
    "pytorch_libtorch": "pytorch",
    "tensorrt_plan": "tensorrt",
}


@dataclass
class Candidate:
    """A model version on disk, ready to register."""

    name: str
    version_dir: Path
    config_path: Path


@dataclass
class RegisterResult:
    model: str
    version: str
    created: bool
    validation: str
    run_id: str = ""
    findings: list[str] = field(default_factory=list)
    signed_by: str = ""  # who signed the version ("": unsigned)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "version": self.version,
            "created": self.created,
            "validation": self.validation,
            "run_id": self.run_id,
            "findings": self.findings,
            "signed_by": self.signed_by,
        }


def check_model_name(name: str) -> str:
    if not MODEL_NAME.match(name):
        raise RegistryError(
            f"invalid model name '{name}': use letters, digits, '.', '-' and '_' "
            "(Triton's rule for repository paths), starting with a letter or digit",
            fix="rename the model folder (and config.pbtxt's name)",
        )
    return name


def find_candidate(path: Path, config: Path | None = None) -> Candidate:
    """A Triton model folder (config.pbtxt + one version folder), or a version folder + config."""
    if not path.is_dir():
        raise RegistryError(f"'{path}' is not a folder", fix="pass a model folder or a version folder")
    if config is not None:
        if not config.is_file():
            raise RegistryError(f"config '{config}' does not exist", fix="pass the model's config.pbtxt")
        name = load_config(config).name or path.resolve().parent.name
        return Candidate(check_model_name(name), path, config)
    if not (path / CONFIG_NAME).is_file():
        raise RegistryError(
            f"'{path}' holds no {CONFIG_NAME}",
            fix="pass a Triton model folder, or a version folder with --config PATH",
        )
    version = _one_version(path)
    cfg = load_config(path / CONFIG_NAME)
    name = path.resolve().name
    if cfg.name and cfg.name != name:
        raise RegistryError(
            f"folder '{name}' holds the config of model '{cfg.name}'",
            fix="make the folder name and config.pbtxt's name equal",
        )
    return Candidate(check_model_name(name), version, path / CONFIG_NAME)


def _one_version(path: Path) -> Path:
    """The model folder's one version folder (named by a number, as Triton reads them)."""
    folders = [p for p in path.iterdir() if p.is_dir() and p.name != "__pycache__"]
    versions = sorted((p for p in folders if p.name.isdigit()), key=lambda p: int(p.name))
    if not versions and folders:
        raise _not_numbers(path, sorted(p.name for p in folders))
    if len(versions) != 1:
        found = ", ".join(p.name for p in versions) or "none"
        raise RegistryError(
            f"'{path}' must hold exactly one version folder (found: {found})",
            fix="pass the version folder itself with --config <model>/config.pbtxt",
        )
    return versions[0]


def _not_numbers(path: Path, names: list[str]) -> ContractError:
    """A model folder whose version folders are not named by numbers (``v1/``): Triton loads none."""
    shown = ", ".join(f"'{name}'" for name in names[:5])
    digits = "".join(c for c in names[0] if c.isdigit()).lstrip("0") or "1"
    return ContractError(
        f"'{path}' holds no version folder: Triton's version folders are named by numbers (1/, 2/, ...), "
        f"and {shown} {'is' if len(names) == 1 else 'are'} not",
        fix=f"rename '{path / names[0]}' to '{path / digits}'",
        file=str(path),
    )


def validate_candidate(candidate: Candidate) -> tuple[list[str], dict[str, Any]]:
    """Contract errors and the artifact's signature, the candidate laid out as a one-model repository."""
    with tempfile.TemporaryDirectory(prefix="mlreg-validate-") as tmp:
        model_dir = Path(tmp) / candidate.name
        model_dir.mkdir()
        shutil.copy2(candidate.config_path, model_dir / CONFIG_NAME)
        (model_dir / "1").symlink_to(candidate.version_dir.resolve(), target_is_directory=True)
        entry = ModelEntry(candidate.name, model_dir, load_config(model_dir / CONFIG_NAME))
        findings = list(check_model(entry))
        if not any(f.rule == "model-file" for f in findings):
            findings.extend(check_artifacts(entry))
        signature = _signature(entry)
        # findings name the user's folders, not this scratch layout
        shown = {
            str(model_dir / "1"): str(candidate.version_dir),
            str(model_dir): str(candidate.config_path.parent),
        }
        errors = [_replace_all(f.line(), shown) for f in findings if f.is_error]
    unsafe = [f for f in findings if f.is_error and f.rule == PATHS_RULE]
    if unsafe:  # never recorded, not even as validation=failed: Triton would run what nobody hashed
        raise ContractError(
            f"{candidate.config_path}: " + "; ".join(f.message for f in unsafe) + "; not registered",
            fix=unsafe[0].fix,
            model=candidate.name,
            file=str(candidate.config_path),
        )
    return errors, signature


def _replace_all(text: str, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        text = text.replace(old, new)
    return text


def _signature(entry: ModelEntry) -> dict[str, Any]:
    try:
        sig = read_signature(entry, "1")
    except ContractError as exc:
        return {"error": exc.message}
    return sig.to_dict() if sig is not None else {"contract": "config.pbtxt (no artifact signature)"}


def register(
    registry: Registrar,
    candidate: Candidate,
    *,
    force: bool = False,
    exporter: Path | None = None,
    export_info: dict[str, Any] | None = None,
    members: dict[str, str] | None = None,
    signer: SigningKey | None = None,
    version_tags: dict[str, str] | None = None,
) -> RegisterResult:
    """Register ``candidate``; with ``signer``, signed over the manifest's digests (no file read
    again), the signature logged beside manifest.json.  Identical bytes already registered return
    that version (signed now when it was not and ``signer`` is given).  ``version_tags`` go on a
    version created now, with its lineage tags (a version reused is left as it is)."""
    config = load_config(candidate.config_path)
    manifest = manifest_of(candidate.version_dir)
    config_sha = sha256_file(candidate.config_path)
    artifact_digest = digest_of_manifest(
        {**manifest, CONFIG_NAME: {"sha256": config_sha, "size": candidate.config_path.stat().st_size}}
    )
    if not force:
        existing = _registered_already(registry, candidate.name, artifact_digest, signer)
        if existing is not None:
            return existing
    bundle = sign(signed_files(manifest, config_sha), signer, candidate.name) if signer else None
    errors, signature = validate_candidate(candidate)
    contract = contract_of(config)
    platform = kind(ModelEntry(candidate.name, candidate.version_dir, config))
    lineage = _lineage(candidate, platform, artifact_digest, contract, exporter, members, errors)
    description = describe(lineage, contract, errors)
    signed_by = claimed_identity(bundle) if bundle else ""
    if bundle:
        description += "\n\n" + signature_line(signed_by)
    run_id = registry.runs.start_run(
        EXPORTS_EXPERIMENT, f"{candidate.name}-export", {"mlreg_model": candidate.name}
    )
    try:
        version = _record(
            registry,
            run_id,
            candidate,
            config_sha,
            manifest,
            signature,
            contract,
            lineage,
            errors,
            description,
            export_info or {},
            bundle,
            version_tags or {},
        )
    except BaseException as exc:
        registry.runs.discard_run(run_id)
        failure = _after_discard(exc, registry.local_root)
        if failure is exc:
            raise
        raise failure from exc
    registry.runs.finish_run(run_id, ok=True)
    return RegisterResult(candidate.name, version, True, lineage.validation, run_id, errors, signed_by)


def _registered_already(
    registry: Registrar, name: str, artifact_digest: str, signer: SigningKey | None
) -> RegisterResult | None:
    """The version of ``name`` registered with these bytes (signed now when it was not and
    ``signer`` is given), else None."""
    for existing in registry.models.find_by_tag(name, "artifact_digest", artifact_digest):
        tags = existing.tags or {}
        signed_by = tags.get(SIGNED_BY_TAG, "")
        if signer is not None and not signed_by:
            signed_by = sign_registered(registry, name, str(existing.version), signer)
        return RegisterResult(
            name,
            str(existing.version),
            False,
            tags.get("validation", "unknown"),
            str(existing.run_id or ""),
            signed_by=signed_by,
        )
    return None


def _lineage(
    candidate: Candidate,
    platform: str,
    artifact_digest: str,
    contract: dict[str, Any],
    exporter: Path | None,
    members: dict[str, str] | None,
    errors: list[str],
) -> Lineage:
    return Lineage(
        # the code that made the artifact: the exporter's checkout, else the folder's own
        model=candidate.name,
        git=git_state((exporter or candidate.version_dir).resolve().parent),
        artifact_digest=artifact_digest,
        contract_digest=digest_of_contract(contract),
        framework=FRAMEWORKS.get(platform, platform),
        platform=platform,
        exporter_sha256=sha256_file(exporter) if exporter else "",
        members=members or {},
        validation="failed" if errors else "passed",
    )


def _after_discard(exc: BaseException, local_root: Path) -> BaseException:
    """What a registration that failed after its run started raises once the run is discarded: a
    full disk says what was cleaned up; anything else is raised as it was."""
    if isinstance(exc, OSError) and is_disk_full(exc):  # a write outside MLflow's calls
        return cleaned_up(disk_full_error(exc, local_root, "registering the version"))
    if isinstance(exc, RegistryError) and is_disk_full(exc):  # an MLflow call's, translated
        return cleaned_up(exc)
    return exc


def signature_line(signed_by: str) -> str:
    """What the version's MLflow description says of its signature."""
    if not signed_by:
        return "**Signature: unsigned**"
    return f"**Signature: signed by {signed_by}** (OpenSSF model signing, `{SIGNATURE_ARTIFACT}`)"


def _record(
    registry: Registrar,
    run_id: str,
    candidate: Candidate,
    config_sha: str,
    manifest: dict[str, Any],
    signature: dict[str, Any],
    contract: dict[str, Any],
    lineage: Lineage,
    errors: list[str],
    description: str,
    export_info: dict[str, Any],
    bundle: bytes | None = None,
    version_tags: dict[str, str] | None = None,
) -> str:
    tensors = len(contract["inputs"]) + len(contract["outputs"])
    params = {"platform": lineage.platform, "framework": lineage.framework, **export_info}
    registry.runs.log(
        run_id,
        params,
        {
            "artifact_bytes": sum(m["size"] for m in manifest.values()),
            "tensor_count": tensors,
            "file_count": len(manifest),
        },
    )
    with tempfile.TemporaryDirectory(prefix="mlreg-register-") as tmp:
        meta = Path(tmp)
        (meta / CONFIG_NAME).write_bytes(candidate.config_path.read_bytes())
        (meta / "signature.json").write_text(json.dumps(signature, indent=1))
        (meta / "manifest.json").write_text(
            json.dumps({"files": manifest, "config_sha256": config_sha}, indent=1, sort_keys=True)
        )
        (meta / "validation.json").write_text(
            json.dumps({"validation": lineage.validation, "errors": errors}, indent=1)
        )
        if bundle is not None:
            (meta / SIGNATURE_ARTIFACT).write_bytes(bundle)
        registry.runs.log_artifacts(run_id, meta)
    registry.models.ensure_model(
        candidate.name, f"Triton model `{candidate.name}` ({lineage.platform}), registered by mlreg."
    )
    tags = lineage.tags()
    if lineage.git.commit == "unknown":  # outside a git checkout nothing is known to be dirty
        del tags["git_dirty"]
    if bundle is not None:
        tags[SIGNED_BY_TAG] = claimed_identity(bundle)
    model_id = registry.runs.log_model(
        run_id,
        EXPORTS_EXPERIMENT,
        logged_model(candidate, contract, tags, {k: str(v) for k, v in params.items()}),
    )
    return registry.models.create_version(
        candidate.name,
        f"models:/{model_id}",
        run_id,
        {**tags, "mlflow_model": "triton", **(version_tags or {})},
        description,
        model_id,
    )


def logged_model(
    candidate: Candidate, contract: dict[str, Any], tags: dict[str, str], params: dict[str, str]
) -> LoggedTritonModel:
    """The candidate as an MLflow Model: the Triton folder, its flavors and the contract as signature."""
    config = load_config(candidate.config_path)
    entry = ModelEntry(candidate.name, candidate.version_dir.parent, config)
    path = model_file(entry, candidate.version_dir.name)
    inner = path.name if path else None
    if path is not None and path.is_dir() and (path / "model.onnx").is_file():
        inner = f"{path.name}/model.onnx"  # an ONNX model folder (external data): the graph file
    return LoggedTritonModel(
        name=candidate.name,
        config_path=candidate.config_path,
        version_dir=candidate.version_dir,
        flavors=flavors_of(candidate.name, contract, inner),
        inputs=tensor_specs(contract["inputs"]),
        outputs=tensor_specs(contract["outputs"]),
        tags=tags,
        params=params,
        metadata={"mlreg": {k: v for k, v in tags.items() if k != "mlreg"}},
    )


def sign_registered(registry: Signatory, name: str, version: str, signer: SigningKey) -> str:
    """Sign a version registered earlier (``mlreg sign``): its registered files are fetched and
    hashed, and signed only when they match the ``artifact_digest`` MLflow recorded; the signature
    is logged to the version's run beside manifest.json.  Returns who signed."""
    tags = registry.models.version_tags(name, version)
    expected = tags.get("artifact_digest", "")
    with tempfile.TemporaryDirectory(prefix="mlreg-sign-") as tmp:
        folder = Path(tmp) / name
        registry.models.fetch_version(name, version, folder)
        config = folder / CONFIG_NAME
        manifest = manifest_of(folder / version)
        config_sha = sha256_file(config)
        config_meta = {"sha256": config_sha, "size": config.stat().st_size}
        if not expected or digest_of_manifest({**manifest, CONFIG_ENTRY: config_meta}) != expected:
            raise SignatureError(
                f"{name} v{version}: the registry's files do not match the artifact_digest MLflow "
                "recorded for it; refusing to sign them",
                fix="register the version's files again (a new version) and sign that one",
                model=name,
                version=version,
            )
        bundle = sign(signed_files(manifest, config_sha), signer, name)
        meta = Path(tmp) / "meta"
        meta.mkdir()
        (meta / SIGNATURE_ARTIFACT).write_bytes(bundle)
        signed_by = claimed_identity(bundle)
        written = SignatureWrite(registry, name, version, tags.get(SIGNED_BY_TAG, ""))
        try:
            registry.runs.log_artifacts(written.run_id, meta)
            registry.models.set_version_tag(name, version, SIGNED_BY_TAG, signed_by)
        except MlregError as exc:
            raise written.undone(exc) from exc
    try:
        _describe_signature(registry, name, version, signed_by)
    except MlregError as exc:
        raise written.signed(exc, signed_by) from exc
    return signed_by


class SignatureWrite:
    """The signature file ``mlreg sign`` writes into a version's run, and the one it replaces: a
    failure before the version's ``signed_by`` tag names the new signer puts the file back as it
    was (an embedded registry's artifacts are local files), or says that it stays."""

    def __init__(self, registry: Signatory, name: str, version: str, was_signed_by: str) -> None:
        self.name, self.version, self.was_signed_by = name, version, was_signed_by
        self.run_id = str(registry.models.version(name, version).run_id)
        folder = local_path(registry.runs.artifact_uri(self.run_id))
        self.path = folder / SIGNATURE_ARTIFACT if folder is not None else None
        self.before = self.path.read_bytes() if self.path is not None and self.path.is_file() else None

    def undone(self, exc: MlregError) -> MlregError:
        """``exc``, once the file is as it was before; saying what stays where it cannot be."""
        if self._put_back():
            return cleaned_up(exc)
        tag = f"its tag still says signed by {self.was_signed_by}" if self.was_signed_by else "unsigned"
        stays = (
            f"the signature it wrote stays in run {self.run_id}'s artifacts ({SIGNATURE_ARTIFACT}) "
            f"while {self.name} v{self.version} is {tag}: 'mlreg sign' again replaces it"
        )
        return _fixed(exc, f"{exc.fix}; {stays}" if exc.fix else stays)

    def _put_back(self) -> bool:
        if self.path is None:  # a remote artifact store: MLflow's client deletes no artifact
            return False
        try:
            if self.before is None:
                self.path.unlink(missing_ok=True)
            else:
                self.path.write_bytes(self.before)
        except OSError:
            return False
        return True

    def signed(self, exc: MlregError, signed_by: str) -> MlregError:
        """``exc`` of the description's update: the version is signed all the same."""
        done = (
            f"{self.name} v{self.version} is signed by {signed_by} (its tag and {SIGNATURE_ARTIFACT}); "
            "only its MLflow description does not say so: 'mlreg sign' again updates it"
        )
        return _fixed(exc, f"{exc.fix}; {done}" if exc.fix else done)


def _fixed(exc: MlregError, fix: str) -> MlregError:
    return type(exc)(exc.message, fix=fix, **exc.context)


def _describe_signature(registry: Signatory, name: str, version: str, signed_by: str) -> None:
    """The version's MLflow description says who signed it (the line replaced when there was one)."""
    current = str(registry.models.version(name, version).description or "")
    kept = "\n".join(line for line in current.splitlines() if not line.startswith("**Signature:"))
    text = kept.rstrip() + "\n\n" + signature_line(signed_by)
    if text == current:  # signed again by the same signer: nothing to write
        return
    registry.models.update_version_description(name, version, text)
