"""What a Triton Deployment serves, as Kubernetes annotations (``model.k8saibom.dev/*``).

Triton loads models at run time over its model-control API, so nothing in a Deployment's manifest
says which model versions its pods serve: inventory tools that read the cluster (k8s-aibom and
the like) cannot see them.  After a promotion the workflow applies this patch to the Deployment:
per model, the version its environment's alias holds, its artifact digest and its signature
reference.  It touches ``metadata.annotations`` only -- never the pod template -- so applying it
restarts no pod.  Built from the registry alone; no cluster is needed to make it
(``kubectl patch deployment triton --type merge --patch-file F``, behind the workflow's flag).
"""

from __future__ import annotations

import hashlib
from typing import Any

from pipelines.promote.ports import Registry
from registry.signing import SIGNATURE_ARTIFACT, SIGNED_BY_TAG

PREFIX = "model.k8saibom.dev/"
NAME_LIMIT = 63  # the name part of an annotation key (after the prefix)


def annotation_key(model: str, field: str) -> str:
    """``model.k8saibom.dev/<model>.<field>``; a model name too long for Kubernetes' 63 characters
    is shortened and keeps a hash of the full name, so two models never share a key."""
    name = f"{model}.{field}"
    if len(name) > NAME_LIMIT:
        tag = hashlib.sha256(model.encode()).hexdigest()[:8]
        name = f"{model[: NAME_LIMIT - len(field) - 10]}-{tag}.{field}"
    return PREFIX + name


def model_annotations(
    model: str, version: str, tags: dict[str, str], run_id: str, environment: str
) -> dict[str, str]:
    """The annotations of one served model version."""
    signed_by = tags.get(SIGNED_BY_TAG, "")
    digest = tags.get("artifact_digest", "")
    return {
        annotation_key(model, "version"): version,
        annotation_key(model, "environment"): environment,
        annotation_key(model, "digest"): f"sha256:{digest}" if digest else "unknown",
        annotation_key(model, "signature"): f"runs:/{run_id}/{SIGNATURE_ARTIFACT}"
        if signed_by
        else "unsigned",
        annotation_key(model, "signed-by"): signed_by or "unsigned",
    }


def annotation_patch(registry: Registry, alias: str, models: list[str], environment: str) -> dict[str, Any]:
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
