"""The MLflow adapter: the one package of mlreg that talks to MLflow.

``registry`` (``MlflowRegistry``: the registry's ports over ``connection``, the client and its
one error translation, ``runs``, ``versions`` and ``deployed``), ``rest`` (read-only
queries over the REST API, no MLflow import), ``sqlite`` (read-only queries on the embedded
registry's file, no MLflow import), ``queries`` (versions and lineage for the CLI), ``environ``
(MLflow's settings set only while it works), ``model`` and ``deployments`` (mlreg's names in
MLflow).  Importing this package, or ``MlflowRegistry``, does not import MLflow (seconds): the
adapter imports it on its first call.  All imports here are absolute, so this subpackage never
stands in for the real ``mlflow``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from registry.mlflow.registry import MlflowRegistry

__all__ = ["MlflowRegistry"]


def __getattr__(name: str) -> Any:
    # PEP 562: a reader of one module (``rest``, ``sqlite``, ``model``) loads only that one
    if name == "MlflowRegistry":
        from registry.mlflow.registry import MlflowRegistry  # lazy: see above

        return MlflowRegistry
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
