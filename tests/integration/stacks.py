"""What the integration stacks share: the template registered as ``mlreg export`` registers it, new
versions without running an exporter again, the snapshot a refused promotion must leave alone, and
the pieces the modules' own stacks of python models are built from (their settings, tritonservers
on stores, an S3 repository, a registered model, ``mlreg`` in a subprocess, paused by the test
hook: :func:`paused_mlreg`, the one helper every such test uses).

:func:`refusal_state` is what every "nothing changed" claim compares: the sha256 of every object of
the store and of its archive, every target's whole repository index (not READY only: a version
loaded and taken back stays listed), the pins of every ensemble each target serves, and every
alias of every model of the registry.

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
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlreg.ops.context import environment
from pipelines.core.context import Options
from pipelines.core.plan import serving_versions
from pipelines.core.reports import PromotionResult
from pipelines.devstack import local_triton
from pipelines.devstack.scratch import scratch_servers
from pipelines.devstack.stack import stack_down, stack_up
from pipelines.fleet.fleet import PAUSE_VARIABLE, RESUME_VARIABLE
from pipelines.guards.headroom import FOOTPRINT_KIND_TAG, FOOTPRINT_TAG
from pipelines.promote.runner import Promotion
from pipelines.storage import open_store
from pipelines.storage.base import LOCK_PREFIX, Repository
from pipelines.triton.control import TritonControl
from registry.contracts.config import CONFIG_NAME
from registry.errors import StorageError
from registry.export import member_versions
from registry.mlflow import MlflowRegistry, sqlite
from registry.register import Candidate, RegisterResult, find_candidate, register
from registry.settings import Settings
from registry.template import BuildResult, exporter_path
from tests.conftest import ROOT, TEMPLATE
from tests.integration import forkcli

ENSEMBLE = "ensemble_multi_modal_model"
MEMBERS = (
    "image_model",
    "image_preprocess",
    "multi_modal_model",
    "table_data_model",
    "table_data_preprocess",
)
MODELS = (*MEMBERS, ENSEMBLE)


def golden() -> Any:
    """The template's ``golden_inputs`` module (the seed's request and its expected answers)."""
    if str(TEMPLATE) not in sys.path:
        sys.path.insert(0, str(TEMPLATE))
    import golden_inputs

    return golden_inputs


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
        members = member_versions(registry.models, folder) if name == ENSEMBLE else None
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


# -- the embedded registry, seeded ------------------------------------------------------------------


def seed_registry(settings: Settings) -> None:
    """Make ``settings``' embedded registry now, if none is there yet, as mlreg makes one: a copy of
    the migrated empty template (registry/mlflow/sqlite.py ``seed``), so that neither a server nor
    a process started on it runs MLflow's migrations.  A remote registry is left alone."""
    uri = settings.tracking_uri
    db = Path(uri.removeprefix("sqlite:///"))
    if not uri.startswith("sqlite:///") or db.exists():
        return
    from mlflow.tracking import MlflowClient

    db.parent.mkdir(parents=True, exist_ok=True)
    sqlite.seed(db, settings.template_cache, MlflowClient)


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
        scratch = scratch_servers(self.settings, env.key(self.settings))  # what the application passes
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
        """What a promotion that went back must have put back: the store's bytes and configs,
        every alias of ``models`` (each environment's, not only local's), what Triton serves (READY:
        the versions it loaded and gave back stay listed in its index, see :meth:`refused`)."""
        return {
            "files": store_files(self.settings.local_repository),
            "aliases": {m: self.registry.models.aliases(m) for m in models},
            "serving": {m: self.serving(m) for m in models},
        }

    def refused(self) -> dict[str, Any]:
        """What a promotion refused before any change must leave alone (:func:`refusal_state`):
        every object of the store and its archive, Triton's whole index and pins, every alias."""
        return refusal_state(self.settings.local_repository, [self.url], self.registry)


@contextlib.contextmanager
def local_stack(build: BuildResult | None, home: Path) -> Iterator[LocalStack]:
    """A stack on ``home`` (``MLREG_HOME``) with the session's build registered as version 1 (an
    empty registry and store for ``None``: a module registering python models of its own)."""
    settings = Settings.from_env(env={"MLREG_HOME": str(home), "PATH": os.environ["PATH"]})
    settings.local_repository.mkdir(parents=True)
    seed_registry(settings)
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
    """A module stack's settings (``MLREG_HOME`` = root/.mlreg, so mlreg.toml is read from ``root``;
    its embedded registry seeded: :func:`seed_registry`) and the variables a ``mlreg`` process needs
    to find the same stack."""
    env_vars = {"MLREG_HOME": str(root / ".mlreg"), **variables}
    settings = Settings.from_env(env={**env_vars, "PATH": os.environ["PATH"]})
    seed_registry(settings)
    return settings, env_vars


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


# How long a test's own tritonserver gets to exit on SIGTERM once the test is done with it, before its
# process group is SIGKILLed: its last seconds prove nothing, and Triton's exit takes 2-4 s (it
# unloads every model, then checks once a second whether they are gone; 5 s after a failed reload).
TEARDOWN_GRACE = 0.5


@contextlib.contextmanager
def tritons(
    settings: Settings,
    root: Path,
    stores: Sequence[str | Path],
    name: str = "triton",
    control_key: str | None = None,
    open_control: bool = False,
) -> Iterator[list[tuple[local_triton.ServerInfo, subprocess.Popen[bytes]]]]:
    """A tritonserver (explicit model control, mlreg's stand-in backends) on each store, state under
    ``root/<name>-<i>``; the list is the module's to change (a replica killed and started again) and
    whatever it holds on leaving is stopped, all at once (``TEARDOWN_GRACE``).  ``control_key``: their
    control API locked to it (default: the suite's key, tests/conftest.py, as production replicas are
    locked: a promotion refuses a replica anyone can drive); ``open_control``: started open."""
    if control_key is None and not open_control:
        control_key = os.environ["MLREG_CONTROL_KEY"]
    servers: list[tuple[local_triton.ServerInfo, subprocess.Popen[bytes]]] = []
    try:
        for index, store in enumerate(stores):
            servers.append(
                local_triton.start_server(
                    store, root / f"{name}-{index}", settings.backends_source, control_key=control_key
                )
            )
        yield servers
    finally:
        local_triton.stop_all(servers, grace=TEARDOWN_GRACE)


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


def mlreg_process(
    env_vars: dict[str, str],
    *args: str,
    new_session: bool = False,
    interruptible: bool = False,
    cwd: Path = ROOT,
) -> forkcli.Process:
    """``python -m mlreg ARGS`` from the checkout, finding the stack through ``env_vars`` (the test
    process's MLFLOW_TRACKING_URI left out), with text pipes for stdout and stderr: a real process
    of its own, forked from the session's fork server with MLflow and mlreg imported
    (tests/integration/forkcli.py), or a fresh interpreter under MLREG_TEST_FRESH_CLI=1."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return forkcli.popen(
        args,
        env={**env, **env_vars},
        cwd=cwd,
        start_new_session=new_session,
        interruptible=interruptible,
    )


def wait_for_pause(process: forkcli.Process, point: str, timeout: float = 240) -> list[str]:
    """Read ``process``'s stderr until mlreg's test hook (``PAUSE_VARIABLE``) says it paused at
    ``point``; the lines read.  An AssertionError showing the last ones when it ended first, or when
    it is still running after ``timeout`` seconds (then SIGABRT first: with PYTHONFAULTHANDLER set,
    where every thread was)."""
    stderr = process.stderr
    assert stderr is not None
    lines: list[str] = []
    paused = threading.Event()

    def read() -> None:
        for line in stderr:
            lines.append(line)
            if line.startswith(f"mlreg-test: paused at {point}"):
                paused.set()
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    if paused.is_set():
        return lines
    if reader.is_alive():  # stuck before the point
        process.send_signal(signal.SIGABRT)
        reader.join(60)
        raise AssertionError(f"no pause at {point} within {timeout:.0f} s:\n{''.join(lines[-60:])}")
    raise AssertionError(f"the promotion ended before {point}:\n{''.join(lines[-20:])}")


@dataclass
class Paused:
    """An ``mlreg`` process stopped by the test hook: the process (a group of its own) and the
    stderr lines it wrote up to the pause."""

    process: forkcli.Process
    lines: list[str] = field(default_factory=list)
    out: str = ""

    def kill(self) -> None:
        """SIGKILL to its whole process group: a crash."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.communicate()

    def finish(self, timeout: float = 150) -> tuple[int, str]:
        """Its exit code and everything it wrote on stderr, once it ends (stdout: ``out``).  Still
        running after ``timeout`` seconds: SIGABRT (every thread's stack, by faulthandler), then an
        AssertionError showing them."""
        try:
            self.out, err = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGABRT)
            _, err = self.process.communicate(timeout=60)
            raise AssertionError(f"mlreg did not exit within {timeout:.0f} s:\n{err[-6000:]}") from None
        return self.process.returncode, "".join(self.lines) + err


@contextlib.contextmanager
def paused_mlreg(
    env_vars: dict[str, str], point: str, *args: str, resume: Path | None = None
) -> Iterator[Paused]:
    """``mlreg ARGS`` (see :func:`mlreg_process`) in a process group of its own, paused by the test
    hook at ``point``: with ``resume``, it goes on once that file exists.  SIGINT is a Ctrl-C there
    (whatever this run inherited) and SIGABRT dumps every thread's stack (faulthandler).  On the
    way out a process still running is killed with its group."""
    env = {**env_vars, PAUSE_VARIABLE: point, "PYTHONFAULTHANDLER": "1"}
    if resume is not None:
        env[RESUME_VARIABLE] = str(resume)
    # SIGINT is a Ctrl-C there even when this run started as a background job: a shell starts those
    # with SIGINT ignored, children inherit it, and Python then never raises KeyboardInterrupt (a
    # clean-clone run launched with ``cmd &`` hung on exactly that)
    process = mlreg_process(env, *args, new_session=True, interruptible=True)
    try:
        yield Paused(process, wait_for_pause(process, point))
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()


def s3_repository(s3_server: Any, bucket: str, prefix: str = "repository") -> str:
    """A new bucket on the session's moto_server and the URI of a store under ``prefix`` in it,
    its root marker written (Triton refuses to start on an S3 prefix with no object under it)."""
    from pipelines.devstack import local_s3
    from pipelines.storage import ensure_root

    local_s3.create_bucket(s3_server.endpoint, bucket)
    store = str(s3_server.store_uri(bucket, prefix))
    ensure_root(store)
    return store


# -- what a refusal must leave alone ----------------------------------------------------------------


def store_objects(store: Repository) -> dict[str, str]:
    """Every object of ``store`` (locks left out) and its sha256."""
    return {
        key: hashlib.sha256(store.objects.read(key) or b"").hexdigest()
        for key in store.objects.list_prefix("")
        if not key.startswith(LOCK_PREFIX)
    }


def ensemble_pins(url: str, states: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """Each ensemble READY on the Triton at ``url`` -> its steps' member -> version, as loaded."""
    pins: dict[str, dict[str, str]] = {}
    with TritonControl(url) as triton:
        for model, versions in sorted(states.items()):
            if "READY" not in versions.values():
                continue
            config = triton.model_config(model)
            if config.get("platform") == "ensemble":
                steps = config.get("ensemble_scheduling", {}).get("step", [])
                pins[model] = {s["model_name"]: str(s.get("model_version", "-1")) for s in steps}
    return pins


def registry_aliases(registry: MlflowRegistry) -> dict[str, dict[str, str]]:
    """Every registered model of ``registry`` -> its aliases (every environment's)."""
    found = registry.connection.client.search_registered_models(max_results=1000)
    return {name: registry.models.aliases(name) for name in sorted(str(m.name) for m in found)}


# A version's footprint is a fact about it, recorded at its first load whatever the promotion's
# outcome and never put back (README "A swap cannot break a replica"): a refusal after the canary
# loaded the candidate may add it.  Every other tag must stay as it was.
MEASURED_TAGS = frozenset({FOOTPRINT_TAG, FOOTPRINT_KIND_TAG})


def registry_tags(registry: MlflowRegistry) -> dict[str, dict[str, dict[str, str]]]:
    """Every version of every registered model of ``registry`` -> its tags (but MEASURED_TAGS):
    ``promoted_<env>``, ``serving_<env>``, ``promotion_run_<env>``, digests, signers..."""
    found = registry.connection.client.search_registered_models(max_results=1000)
    tags: dict[str, dict[str, dict[str, str]]] = {}
    for name in sorted(str(m.name) for m in found):
        versions = registry.connection.client.search_model_versions(f"name='{name}'", max_results=10_000)
        tags[name] = {
            str(v.version): {k: str(t) for k, t in sorted(v.tags.items()) if k not in MEASURED_TAGS}
            for v in sorted(versions, key=lambda v: int(v.version))
        }
    return tags


def refusal_state(store: str | Path, targets: Sequence[str], registry: MlflowRegistry) -> dict[str, Any]:
    """Everything a refused promotion must leave alone, as one value to compare: the sha256 of every
    object of the store and of its archive (locks left out), every target's whole repository index
    (every model, every version Triton lists and its state: a version loaded and taken back again
    stays listed UNAVAILABLE; UNLOADING reads as UNAVAILABLE, unloads being async), the pins of
    every ensemble each target serves, and every alias and every version tag of every model of the
    registry (a footprint measured at a load excepted: MEASURED_TAGS)."""
    opened = open_store(store)
    try:
        archive: dict[str, str] | None = store_objects(opened.archive())
    except StorageError:
        archive = None  # a store with no place for an archive
    index: dict[str, dict[str, dict[str, str]]] = {}
    pins: dict[str, dict[str, dict[str, str]]] = {}
    for url in targets:
        with TritonControl(url) as triton:
            states = triton.model_states()
        index[url] = {
            model: {v: "UNAVAILABLE" if s == "UNLOADING" else s for v, s in versions.items()}
            for model, versions in states.items()
        }
        pins[url] = ensemble_pins(url, states)
    return {
        "objects": store_objects(opened),
        "archive": archive,
        "index": index,
        "pins": pins,
        "aliases": registry_aliases(registry),
        "tags": registry_tags(registry),
    }


def unloaded_on(state: dict[str, Any], url: str, model: str, *versions: str) -> dict[str, Any]:
    """``state`` (a :func:`refusal_state`) as it reads once ``url`` loaded ``versions`` of ``model``
    and took them back: Triton's index then lists them UNAVAILABLE, nothing else changes."""
    index = {u: {m: dict(v) for m, v in models.items()} for u, models in state["index"].items()}
    index[url].setdefault(model, {}).update(dict.fromkeys(versions, "UNAVAILABLE"))
    return {**state, "index": index}
