"""The names of what a Triton Deployment serves, as Kubernetes annotations (``model.k8saibom.dev/*``).

Triton loads models at run time over its model-control API, so nothing in a Deployment's manifest
says which model versions its pods serve: inventory tools that read the cluster (k8s-aibom and
the like) cannot see them.  These are the keys and values of one served version -- its version,
environment, artifact digest and signature reference -- read from its registry tags alone.  The
patch of a Deployment built from them is ``mlreg k8s-annotations`` (:mod:`mlreg.ops.k8s_annotations`).
"""

from __future__ import annotations

import hashlib

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


__all__ = ["NAME_LIMIT", "PREFIX", "annotation_key", "model_annotations"]
