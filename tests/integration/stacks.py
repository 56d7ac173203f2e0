"""What the integration stacks share: the template registered as ``mlreg export`` registers it, new
versions without running an exporter again, the snapshot a refused promotion must leave alone, and
the pieces the modules' own stacks of python models are built from (their settings, tritonservers
on stores, an S3 repository, a registered model, ``mlreg`` in a subprocess, the test hook's pause).

One TensorFlow export per session (``built_repository`` in tests/conftest.py, plus image_model
re-exported once with another seed where a test needs other *answers*).  A test that needs only a
new *version* (other bytes, same contract) gets one from :func:`new_bytes`: what a re-export of the
same weights makes, seconds cheaper than running the exporter.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlreg.service import environment
from pipelines.devstack import local_triton
from pipelines.devstack.scratch import scratch_servers
from pipelines.devstack.stack import stack_down, stack_up
from pipelines.promote.plan import serving_versions
from pipelines.promote.reports import PromotionResult
from pipelines.promote.runner import Options, Promotion
from pipelines.storage import open_store
from pipelines.triton import TritonControl
from registry.contracts.config import CONFIG_NAME
from registry.export import member_versions
from registry.mlflow import MlflowRegistry
from registry.register import Candidate, RegisterResult, find_candidate, register
from registry.settings import Settings
from registry.template import BuildResult, exporter_path
from tests.conftest import ROOT, TEMPLATE

ENSEMBLE = "ensemble_multi_modal_model"
MEMBERS = (
    "image_model",
    "image_preprocess",
    "multi_modal_model",
    "table_data_model",
    "table_data_preprocess",
)
MODELS = (*MEMBERS, ENSEMBLE)

# The smallest real model: python backend, INPUT0 x SCALE (format with name= / scale=).
SCALING_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""
SCALING_MODEL_PY = """import numpy as np
import triton_python_backend_utils as pb_utils

SCALE = {scale}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", (x * SCALE).astype(np.float32))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""


def exported_folder(built: Path, model: str, dest: Path) -> Path:
    """``model`` as ``mlreg export`` stages it: the built folder with the template's own config
    (KIND_GPU kept: devices are adapted at deploy; the session build rewrote them for this CPU)."""
    folder = dest / model
    shutil.copytree(built / model, folder)
    shutil.copy2(TEMPLATE / model / CONFIG_NAME, folder / CONFIG_NAME)
    return folder


def register_template(
    registry: MlflowRegistry, build: BuildResult, dest: Path, models: tuple[str, ...] = MODELS
) -> list[RegisterResult]:
    """What ``export_models`` registers, members before the ensemble, with the exporters' lineage and
    the export's information, from the session's build instead of a second export."""
    results = []
    for name in sorted(models, key=lambda m: (m == ENSEMBLE, m)):
        folder = exported_folder(build.out, name, dest)
        members = member_versions(registry, folder) if name == ENSEMBLE else None
        results.append(
            register(
                registry,
                find_candidate(folder),
                exporter=exporter_path(TEMPLATE / name),
                export_info=dict(build.exported.get(name) or {}),
                members=members,
            )
        )
    return results


def new_bytes(source: Path, dest: Path, release: str) -> Path:
    """A copy of the model folder ``source`` with other bytes, the same contract and the same answers:
    a SavedModel gains an asset, an ONNX model a metadata entry, python code a comment."""
    folder = dest / source.name
    shutil.copytree(source, folder)
    version = folder / "1"
    saved = next(version.rglob("saved_model.pb"), None)
    onnx_file = next(version.rglob("*.onnx"), None)
    if saved is not None:
        (saved.parent / "assets").mkdir(exist_ok=True)
        (saved.parent / "assets" / "release.txt").write_text(f"{source.name}, release {release}\n")
    elif onnx_file is not None:
        import onnx

        model = onnx.load(str(onnx_file))
        model.metadata_props.add(key="release", value=release)
        onnx.save(model, str(onnx_file))
    elif (version / "model.py").is_file():
        code = version / "model.py"
        code.write_text(f"{code.read_text()}\n# release {release}\n")
    else:
        raise AssertionError(f"no model file to vary in {version}")
    return folder


def register_new_bytes(registry: MlflowRegistry, source: Path, dest: Path, release: str) -> str:
    """:func:`new_bytes` registered (with the exporter's lineage, as a re-export); its version."""
    folder = new_bytes(source, dest, release)
    exporter = exporter_path(TEMPLATE / source.name)
    return register(registry, find_candidate(folder), exporter=exporter).version


def store_files(root: Path) -> dict[str, str]:
    """The store's files and their sha256 (locks left out): its bytes and configs."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".mlreg-lock.")
    }


@dataclass
class LocalStack:
    """``mlreg stack up``'s stack on a home of its own: Triton (explicit mode) on the local store,
    the embedded MLflow registry, the template registered as ``mlreg export`` registers it."""

    settings: Settings
    registry: MlflowRegistry
    url: str
    log: Path

    @property
    def env_vars(self) -> dict[str, str]:
        """What a ``mlreg`` process needs to find this stack."""
        return {"MLREG_HOME": str(self.settings.home)}

    @property
    def exports(self) -> Path:
        return self.settings.home.parent / "exports"

    def promotion(self, **options: Any) -> Promotion:
        env = environment(self.settings, "local")
        scratch = scratch_servers(self.settings)  # what the application passes: the dry-run gate's servers
        return Promotion(self.settings, env, self.registry, Options(**options), scratch=scratch)

    def promote(self, model: str, version: str, **options: Any) -> PromotionResult:
        return self.promotion(**options).run(model, version)

    def states(self) -> dict[str, dict[str, str]]:
        with TritonControl(self.url) as triton:
            return triton.model_states()

    def serving(self, model: str) -> list[str]:
        return sorted((v for v, s in self.states().get(model, {}).items() if s == "READY"), key=int)

    def desired(self, model: str) -> list[str]:
        return serving_versions(open_store(self.settings.local_repository).read_config(model))

    def instance_starts(self, model: str) -> int:
        """How many instances of ``model`` (any version) the server has initialized so far."""
        return self.log.read_text(errors="replace").count(f"ModelInstanceInitialize: {model}_")

    def reexport(self, model: str, release: str) -> str:
        """A re-export of ``model``'s weights (other bytes, same contract and answers): its version."""
        work = self.settings.home.parent / f"release-{release}"
        return register_new_bytes(self.registry, self.exports / model, work, release)

    def snapshot(self, models: tuple[str, ...] = MODELS) -> dict[str, object]:
        """Everything a refused promotion must leave alone: the store's bytes and configs, every
        alias of every model (each environment's, not only local's), what Triton serves."""
        return {
            "files": store_files(self.settings.local_repository),
            "aliases": {m: self.registry.aliases(m) for m in models},
            "serving": {m: self.serving(m) for m in models},
        }


@contextlib.contextmanager
def local_stack(build: BuildResult | None, home: Path) -> Iterator[LocalStack]:
    """A stack on ``home`` (``MLREG_HOME``) with the session's build registered as version 1 (an
    empty registry and store for ``None``: a module registering python models of its own)."""
    settings = Settings.from_env(env={"MLREG_HOME": str(home), "PATH": os.environ["PATH"]})
    settings.local_repository.mkdir(parents=True)
    status = stack_up(settings, ui=False)
    registry = MlflowRegistry(settings)
    try:
        if build is not None:
            register_template(registry, build, home.parent / "exports")
        assert status.info is not None
        yield LocalStack(settings, registry, status.info.grpc_url, Path(status.info.log_path))
    finally:
        stack_down(settings)


# -- the pieces of the modules' own stacks (python models on tritonservers of their own) ----------

# ``scorer``: a python model answering X times its version number (``SCORER_MODEL`` is its
# model.py; a version's bytes differ by a leading comment, see ``register_scorer``).
SCORER_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.factor = float(args["model_version"])

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * self.factor)]
            )
            for r in requests
        ]
"""
SCORER_CONFIG = """name: "scorer"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def stack_settings(root: Path, **variables: str) -> tuple[Settings, dict[str, str]]:
    """A module stack's settings (``MLREG_HOME`` = root/.mlreg, so mlreg.toml is read from ``root``)
    and the variables a ``mlreg`` process needs to find the same stack."""
    env_vars = {"MLREG_HOME": str(root / ".mlreg"), **variables}
    return Settings.from_env(env={**env_vars, "PATH": os.environ["PATH"]}), env_vars


def register_model(
    registry: MlflowRegistry,
    folder: Path,
    model: str,
    config: str,
    files: dict[str, str | bytes],
    members: dict[str, str] | None = None,
) -> str:
    """``files`` (name -> text or bytes) written as version folder ``folder/1`` beside ``config``,
    registered as ``model``; the version number (identical bytes reuse their version)."""
    (folder / "1").mkdir(parents=True)
    (folder / CONFIG_NAME).write_text(config)
    for name, content in files.items():
        path = folder / "1" / name
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    candidate = Candidate(model, folder / "1", folder / CONFIG_NAME)
    return register(registry, candidate, members=members).version


def register_scorer(registry: MlflowRegistry, work: Path, tag: str, weights: int = 64 << 10) -> str:
    """A new version of ``scorer``: ``tag`` makes its model.py differ, ``weights`` random bytes lie
    beside it (a version of some size to upload, archive and verify)."""
    files: dict[str, str | bytes] = {
        "model.py": f"# {tag}\n{SCORER_MODEL}",
        "weights.bin": os.urandom(weights),
    }
    return register_model(registry, work / tag, "scorer", SCORER_CONFIG, files)


@contextlib.contextmanager
def tritons(
    settings: Settings, root: Path, stores: Sequence[str | Path], name: str = "triton"
) -> Iterator[list[tuple[local_triton.ServerInfo, subprocess.Popen[bytes]]]]:
    """A tritonserver (explicit model control, mlreg's stand-in backends) on each store, state under
    ``root/<name>-<i>``; the list is the module's to change (a replica killed and started again) and
    whatever it holds on leaving is stopped."""
    servers: list[tuple[local_triton.ServerInfo, subprocess.Popen[bytes]]] = []
    try:
        for index, store in enumerate(stores):
            servers.append(
                local_triton.start_server(store, root / f"{name}-{index}", settings.backends_source)
            )
        yield servers
    finally:
        for info, process in servers:
            local_triton.stop_pid(info.pid, info.shm_prefix, process=process)


def triton_index(url: str, model: str) -> dict[str, str]:
    """Every version of ``model`` in the repository index of the Triton at ``url`` and its state --
    not READY only: a version loaded and unloaded again stays listed, so a refusal that loaded a
    candidate and took it back shows here.  UNLOADING reads as UNAVAILABLE (unloads are async)."""
    with TritonControl(url) as triton:
        states = triton.model_states().get(model, {})
    return {v: "UNAVAILABLE" if s == "UNLOADING" else s for v, s in states.items()}


def ready_versions(url: str, model: str) -> list[str]:
    """The versions of ``model`` READY on the Triton at ``url``, in numeric order."""
    with TritonControl(url) as triton:
        states = triton.model_states().get(model, {})
    return sorted((v for v, s in states.items() if s == "READY"), key=int)


def mlreg_process(env_vars: dict[str, str], *args: str, **popen: Any) -> subprocess.Popen[str]:
    """``python -m mlreg ARGS`` from the checkout, finding the stack through ``env_vars`` (the test
    process's MLFLOW_TRACKING_URI left out), with text pipes for stdout and stderr."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return subprocess.Popen(
        [sys.executable, "-m", "mlreg", *args],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**env, **env_vars},
        **popen,
    )


def wait_for_pause(process: subprocess.Popen[str], point: str) -> list[str]:
    """Read ``process``'s stderr until mlreg's test hook (``PAUSE_VARIABLE``) says it paused at
    ``point``; the lines read.  An AssertionError showing the last ones when it ended first."""
    assert process.stderr is not None
    lines = []
    for line in process.stderr:
        lines.append(line)
        if line.startswith(f"mlreg-test: paused at {point}"):
            return lines
    raise AssertionError(f"the promotion ended before {point}:\n{''.join(lines[-20:])}")


def s3_repository(s3_server: Any, bucket: str, prefix: str = "repository") -> str:
    """A new bucket on the session's moto_server and the URI of a store under ``prefix`` in it,
    its root marker written (Triton refuses to start on an S3 prefix with no object under it)."""
    from pipelines.devstack import local_s3
    from pipelines.storage import ensure_root

    local_s3.create_bucket(s3_server.endpoint, bucket)
    store = str(s3_server.store_uri(bucket, prefix))
    ensure_root(store)
    return store
