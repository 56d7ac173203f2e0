"""``mlreg store repair``: put a stored version's registered bytes back, as a promotion does when
it finds them changed (``check_stored`` + ``apply_repair``).

What a stored version was first written as is what MLflow registered: the version's
``artifact_digest`` and the signature logged with it.  The registry's copy, checked against that
digest, is re-sent where the stored bytes differ, then verified; a signed version's
``.mlreg-signature.json`` is kept, MLflow's written back where the store's is missing or another.
Everything happens under the model's lock (:mod:`pipelines.storage.locking`).  An ensemble's folder holds
no bytes and is re-pointed in place by promotions: it is refused.
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlreg.ops.store_verify import DIGEST_TAG
from pipelines.core.plan import Role, Step, config_facts
from pipelines.promote.integrity import apply_repair, check_stored, registered_signature
from pipelines.storage.locking import model_lock
from pipelines.storage.verify import SIGNATURE_FILE
from registry.errors import RegistryError, StorageError, UsageError
from registry.settings import Settings

if TYPE_CHECKING:
    from pipelines.storage.base import Repository
    from pipelines.storage.objects import ObjectStore
    from registry.ports import RegistryView


@dataclass
class RepairReport:
    store: str
    model: str
    version: str
    repaired: str  # what was wrong and is put back ("": the stored bytes verified, nothing sent)
    signature: str  # "kept", "put back from MLflow", or "" (the version is not signed)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        what = self.repaired or f"{self.model}/{self.version} verifies: nothing to repair"
        signature = f"; signature {self.signature}" if self.signature else ""
        return f"{self.store}: {what}{signature}"


def store_repair(
    settings: Settings,
    model: str,
    version: str,
    registry: RegistryView,
    store: Repository,
) -> RepairReport:
    """Put ``model`` ``version``'s registered bytes back into ``store`` (see the module's docstring).
    Refused for a version the store does not hold and for an ensemble's folder."""
    _require_repairable(store, model, version)
    try:
        digest = registry.models.version_tags(model, version).get(DIGEST_TAG, "")
    except RegistryError as exc:
        exc.message += ": the store's copy has no registered bytes to be repaired from"
        raise
    step = Step(model, version, Role.MODEL, None, "", None, [])
    with (
        tempfile.TemporaryDirectory(prefix="mlreg-repair-") as tmp,
        model_lock(store.session, model, settings),
    ):
        found = check_stored(store, registry.models, step, version, digest, Path(tmp))
        repaired = apply_repair(store.versions, found) if found is not None else ""
        signature = _signature_back(store.objects, registry, model, version, Path(tmp))
    return RepairReport(store.uri, model, version, repaired, signature)


def _require_repairable(store: Repository, model: str, version: str) -> None:
    if not version.isdigit():
        raise UsageError(f"version '{version}' is not a number", fix="pass a positive version number")
    stored = store.list_versions(model)
    if version not in stored:
        raise StorageError(
            f"{store.uri}: {model} v{version} is not in the store (stored: {', '.join(stored) or 'none'})",
            fix=f"nothing to repair: 'mlreg promote {model} --version {version}' uploads it",
        )
    if config_facts(store.read_config(model) or "").is_ensemble:
        raise UsageError(
            f"{model} is an ensemble: its folder holds no bytes, only the config promotions re-point",
            fix=f"promote it again ('mlreg promote {model} --version N') to rewrite its config",
        )


def _signature_back(
    store: ObjectStore, registry: RegistryView, model: str, version: str, workdir: Path
) -> str:
    registered = registered_signature(registry, model, version, workdir)  # None: not signed
    key = f"{model}/{version}/{SIGNATURE_FILE}"
    stored = store.read(key)
    if registered is None or stored == registered:
        return "kept" if stored is not None else ""
    store.write(key, registered)
    return "put back from MLflow"


__all__ = ["RepairReport", "store_repair"]
