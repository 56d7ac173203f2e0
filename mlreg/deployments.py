"""``mlflow deployments -t mlreg``: mlreg's promotion as an MLflow deployment target.

The command shapes are those of NVIDIA's mlflow-triton plugin, so its users switch by changing
``-t triton`` to ``-t mlreg``::

    mlflow deployments create -t mlreg --name image_model -m models:/image_model/2 [-C env=staging]
    mlflow deployments update -t mlreg --name image_model -m models:/image_model@candidate
    mlflow deployments get    -t mlreg --name image_model        # what each replica serves
    mlflow deployments list   -t mlreg [-t mlreg:/staging]
    mlflow deployments delete -t mlreg --name image_model        # unloaded, its folder archived
    mlflow deployments predict -t mlreg --name image_model --input-path in.json
    mlflow deployments run-local -t mlreg --name image_model -m models:/image_model/2

Unlike a copy to one server, ``create``/``update`` run the whole promotion (contract and ensemble
checks, quality gate, upload, swap with the old version serving until the new one answers,
rollback on failure, the MLflow alias moved last).  The environment is ``-C env=NAME`` or the
target URI ``mlreg:/NAME`` (default ``local``, the local stack); the other promote options are
config keys: ``dry_run``, ``allow_breaking``, ``skip_quality``, ``serve_as``.  mlreg's errors come
out as ``MlflowException`` carrying mlreg's message and fix.

NVIDIA's flavors deploy too (``registry.nvidia_flavors``): ``--flavor onnx`` takes a model logged
by ``mlflow.onnx.log_model`` (with or without a ``config.pbtxt`` logged beside it) and ``--flavor
triton`` NVIDIA's ``mlflow_triton.log_model`` folder; each is registered once as an mlreg version of
the same model (lineage tags both ways) and that version is promoted.  ``predict`` takes NVIDIA's
``{"inputs": {...}}`` document and answers ``{"outputs": {...}}``, as NVIDIA's plugin does.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from mlflow.deployments import BaseDeploymentClient, PredictionsResponse
from mlflow.exceptions import MlflowException

from mlreg.deployment_io import _arrays, _deployment, check_name, promote_options
from registry.errors import MlregError, UsageError
from registry.settings import Settings

if TYPE_CHECKING:
    from registry.mlflow import MlflowRegistry

TARGET = "mlreg"
MODEL_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:/(?P<version>\d+)|@(?P<alias>[\w.\-]+))$")


def _telemetry_off() -> None:
    """As the mlreg CLI does (registry.mlflow): MLflow's usage telemetry holds each
    command's exit for seconds (longer offline); a team opts in with MLFLOW_DISABLE_TELEMETRY=false."""
    if "MLFLOW_DISABLE_TELEMETRY" in os.environ:
        return
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    with contextlib.suppress(Exception):  # MLflow's private API: best effort
        from mlflow.telemetry.client import (  # lazy: mlflow ~1.5 s, the plugin only
            get_telemetry_client,
            set_telemetry_client,
        )

        client = get_telemetry_client()
        if client is not None:
            client.flush(terminate=True)
        set_telemetry_client()


_telemetry_off()


def target_help() -> str:
    return (
        "mlreg: promote registered Triton models with validation, quality gate, rollout and rollback.\n\n"
        "Target URI: 'mlreg' (environment from -C env=NAME, default 'local') or 'mlreg:/ENV'.\n"
        "Model URI: models:/NAME/VERSION or models:/NAME@ALIAS; --name must be the registered NAME.\n\n"
        "Flavor: triton (default; mlreg's versions and NVIDIA's mlflow_triton.log_model folders) or\n"
        "onnx (mlflow.onnx.log_model, config.pbtxt logged beside it or made from the graph): NVIDIA's\n"
        "flavors are registered once as an mlreg version of the same model, then promoted.\n\n"
        "Config (-C key=value): env=local|<mlreg.toml environment>, dry_run=true (plan only),\n"
        "allow_breaking=true, skip_quality=true, serve_as=auto|native|onnx.\n\n"
        "create/update: run `mlreg promote NAME --version V --env ENV` (refused versions change nothing).\n"
        "get/list: what the environment's store wants and each replica serves, the alias, drift.\n"
        "delete: unload NAME from every replica, remove its desired state and move its versions to the\n"
        "store's archive (refused while an ensemble uses it; its versions stay in MLflow).\n"
        "predict: send a DataFrame (columns = input tensors), a dict of arrays or NVIDIA's\n"
        '{"inputs": {NAME: [...]}} document to the environment\'s first replica.\n'
        "run-local: start the local stack (a real tritonserver) and create the deployment in 'local'.\n"
    )


def run_local(
    target: str, name: str, model_uri: str, flavor: str | None = None, config: dict[str, Any] | None = None
) -> None:
    """Start the local stack if it is not running, then promote ``model_uri`` into ``local``."""
    from pipelines.devstack.stack import running_server, stack_up  # lazy: only run-local starts a stack

    with _translated():
        settings = Settings.from_env()
        if running_server(settings) is None:
            settings.local_repository.mkdir(parents=True, exist_ok=True)
            stack_up(settings)
    client = MlregDeploymentClient(target)
    client.create_deployment(name, model_uri, flavor, {**(config or {}), "env": "local"})


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    """mlreg's errors as MlflowException (message + fix); MlflowException passes unchanged."""
    try:
        yield
    except MlregError as exc:
        from mlflow.protos.databricks_pb2 import (  # lazy: mlflow ~1.5 s, on an error only
            INVALID_PARAMETER_VALUE,
            RESOURCE_DOES_NOT_EXIST,
        )

        text = f"error: {exc.message}" + (f"\nfix: {exc.fix}" if exc.fix else "")
        code = RESOURCE_DOES_NOT_EXIST if "DOES_NOT_EXIST" in str(exc.context.get("code", "")) else None
        raise MlflowException(text, error_code=code or INVALID_PARAMETER_VALUE) from exc


class MlregDeploymentClient(BaseDeploymentClient):
    """One client per target URI; ``mlreg:/staging`` makes ``staging`` the default environment."""

    def __init__(self, target_uri: str) -> None:
        super().__init__(target_uri)
        env = target_uri.split(":", 1)[1].strip("/") if ":" in target_uri else ""
        self.default_env = env or "local"

    # -- helpers --------------------------------------------------------------------------------

    def _context(self, config: dict[str, Any] | None = None) -> tuple[Settings, Any, MlflowRegistry]:
        from mlreg.ops.context import context  # lazy: the verbs import the promotion package

        settings = Settings.from_env()
        ctx = context(settings, self._env_name(config))
        return settings, ctx.env, ctx.registry

    def _env_name(self, config: dict[str, Any] | None = None) -> str:
        """``-C env=NAME``, else the target URI's environment."""
        return str((config or {}).get("env") or self.default_env)

    @staticmethod
    def _version(registry: MlflowRegistry, name: str, model_uri: str) -> str:
        match = MODEL_URI.match(model_uri or "")
        if match is None:
            raise UsageError(
                f"model URI '{model_uri}' is not models:/NAME/VERSION or models:/NAME@ALIAS",
                fix=f"pass -m models:/{name}/<version> (see 'mlreg versions {name}')",
            )
        if match["name"] != name:
            raise UsageError(
                f"--name '{name}' differs from the model URI's model '{match['name']}'",
                fix="mlreg deploys a registered model under its own name: make them equal",
            )
        if match["version"]:
            return str(match["version"])
        version = registry.models.aliases(name).get(match["alias"])
        if version is None:
            raise UsageError(
                f"model {name} has no alias '{match['alias']}'",
                fix=f"see 'mlreg versions {name}' for its aliases",
            )
        return str(version)

    def _promote(self, name: str, model_uri: str, flavor: str | None, config: dict[str, Any] | None) -> dict:
        from mlreg.ops.promote import promote  # lazy: the verbs import the promotion package
        from pipelines.ledger.recorder import operation  # lazy: with the promotion
        from registry.nvidia_flavors import check_flavor, deployable  # lazy: NVIDIA's flavors only here

        check_name(name)
        check_flavor(flavor)
        options = promote_options({k: v for k, v in (config or {}).items() if k != "env"})
        settings, env, registry = self._context(config)
        version = self._version(registry, name, model_uri)
        found = deployable(registry, name, version, flavor)  # NVIDIA's onnx/triton: an mlreg version
        with operation("deployments"):  # the ledger's events say which verb sent the calls
            result = promote(settings, env.name, name, found.version, options)
        return {
            "name": name,
            "flavor": found.flavor,
            "version": result.plan.version,
            "source_version": found.source_version,
            "environment": env.name,
            "dry_run": options.dry_run,
            "promotion_run": result.run_id,
            "stages": [f"{s.stage}: {s.status} ({s.detail})" for s in result.stages],
        }

    # -- the MLflow deployments API -------------------------------------------------------------

    def create_deployment(self, name, model_uri, flavor=None, config=None, endpoint=None):  # type: ignore[no-untyped-def]
        with _translated():
            return self._promote(name, model_uri, flavor, config)

    def update_deployment(self, name, model_uri=None, flavor=None, config=None, endpoint=None):  # type: ignore[no-untyped-def]
        if model_uri is None:
            raise MlflowException(
                "error: update needs the version to serve\nfix: pass -m models:/NAME/VERSION",
                error_code="INVALID_PARAMETER_VALUE",
            )
        with _translated():
            return self._promote(name, model_uri, flavor, config)

    def delete_deployment(self, name, config=None, endpoint=None):  # type: ignore[no-untyped-def]
        from mlreg.ops.retire import retire  # lazy: the verbs import the promotion package

        with _translated():
            retire(Settings.from_env(), self._env_name(config), check_name(name))

    def list_deployments(self, endpoint=None):  # type: ignore[no-untyped-def]
        with _translated():
            settings, env, registry = self._context()
            return [_deployment(env.name, row) for row in _status(settings, env, registry, None)]

    def get_deployment(self, name, endpoint=None):  # type: ignore[no-untyped-def]
        with _translated():
            settings, env, registry = self._context()
            rows = _status(settings, env, registry, [check_name(name)])
            if not rows or not (rows[0]["desired"] or rows[0]["alias"]):
                raise MlflowException(
                    f"error: {name} is not deployed in '{env.name}'\nfix: create it with "
                    f"'mlflow deployments create -t mlreg --name {name} -m models:/{name}/N'",
                    error_code="RESOURCE_DOES_NOT_EXIST",
                )
            found = _deployment(env.name, rows[0])
            with contextlib.suppress(MlregError):
                found.update(registry.deployed.deployments(name).get(env.name, {}))
                found.update(_source(registry, name, rows[0]["alias"]))
            return found

    def predict(self, deployment_name=None, inputs=None, endpoint=None):  # type: ignore[no-untyped-def]
        from mlreg.ops.predict import predict  # lazy: the verbs import numpy and tritonclient

        with _translated():
            if not deployment_name:
                raise UsageError(
                    "predict needs the deployment's name (mlreg has no endpoints)",
                    fix="pass --name MODEL (see 'mlflow deployments list -t mlreg')",
                )
            arrays = _arrays(inputs)  # names and dtypes are checked against the deployed config
            name = check_name(deployment_name)
            answer = predict(Settings.from_env(), self._env_name(), name, arrays)
            return PredictionsResponse({"outputs": {key: value.tolist() for key, value in answer.items()}})


def _status(
    settings: Settings, env: Any, registry: MlflowRegistry, models: list[str] | None
) -> list[dict[str, Any]]:
    """``mlreg status``'s rows (their JSON documents) for ``models`` (None: every model)."""
    from mlreg.ops.status import status  # lazy: the verbs import the promotion package

    if models is None:
        return [row.to_dict() for row in status(settings, env.name).models]
    return [row.to_dict() for model in models for row in status(settings, env.name, model).models]


def _source(registry: MlflowRegistry, name: str, version: str | None) -> dict[str, Any]:
    """The MLflow model a deployment came from (NVIDIA's ``mlflow_model_uri``) and its flavor."""
    from registry.nvidia_flavors import source_of  # lazy: NVIDIA's flavors only here

    if not version:
        return {}
    found = source_of(registry.models.version_tags(name, version))
    if found is None:
        return {"mlflow_model_uri": f"models:/{name}/{version}"}
    return {"mlflow_model_uri": f"models:/{name}/{found[0]}", "flavor": found[1]}
