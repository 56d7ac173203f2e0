"""``mlreg k8s-annotations``: a merge patch of a Triton Deployment's metadata naming what it serves.

After a promotion the workflow applies it to the Deployment: per model, the version its
environment's alias holds, its artifact digest and its signature reference
(:mod:`registry.k8s_annotations` names the keys).  It touches ``metadata.annotations`` only --
never the pod template -- so applying it restarts no pod.  Built from the registry alone; no
cluster is needed to make it (``kubectl patch deployment triton --type merge --patch-file F``).
"""

from __future__ import annotations

from typing import Any

from mlreg.ops.context import open_registry
from pipelines.promote.environments import environment as configured
from registry.k8s_annotations import model_annotations
from registry.ports import RegistryReader
from registry.settings import Settings


def annotation_patch(
    registry: RegistryReader, alias: str, models: list[str], environment: str
) -> dict[str, Any]:
    """A merge patch (``kubectl patch --type merge``) of a Deployment's metadata: every model of
    ``models`` (none: every registered model) whose ``alias`` names a version; a model without it
    is left out."""
    annotations: dict[str, str] = {}
    for model in sorted(models or registry.alias_versions(alias)):
        version = registry.aliases(model).get(alias)
        if version is None:
            continue
        tags = registry.version_tags(model, version)
        run_id = str(registry.version(model, version).run_id or "")
        annotations.update(model_annotations(model, version, tags, run_id, environment))
    return {"metadata": {"annotations": annotations}}


def k8s_annotations(settings: Settings, env_name: str, models: list[str] | None = None) -> dict[str, Any]:
    """The patch for ``env_name``'s Deployment: what its alias holds of ``models`` (default: all)."""
    alias = configured(settings, env_name).alias
    return annotation_patch(open_registry(settings).models, alias, models or [], env_name)


__all__ = ["annotation_patch", "k8s_annotations"]
