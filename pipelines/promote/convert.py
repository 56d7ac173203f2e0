"""Serve a SavedModel as ONNX: NVIDIA's Triton containers after 25.02 have no TensorFlow backend.

The SavedModel's serving signature is converted with the tf2onnx CLI (a separate process, so
TensorFlow never loads into the CLI), the config is rewritten for ``onnxruntime_onnx``, the two
artifacts must agree on the golden inputs (onnxruntime vs TensorFlow, in a worker process), and
the derived artifact is numbered while planning and registered in MLflow (a new version with
``derived_from`` lineage) by the first live stage: a dry run registers nothing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from pipelines.core.plan import Step, desired_config
from pipelines.core.ports import DerivedVersions, RegistryReader, RegistryWriter
from pipelines.core.reports import Converted
from registry.contracts.config import CONFIG_NAME, format_config, parse_config
from registry.errors import MissingDependencyError, PromotionError
from registry.manifest import artifact_digest

OPSET = 13
TENSORFLOW_TIMEOUT_S = 900  # a conversion or parity run here: 4-30 s; a hung TensorFlow holds the locks
PARITY_RTOL = 1e-4
PARITY_ATOL = 1e-4
TF_BACKEND_LAST = (2, 55)  # Triton 2.55 = container 25.02, the last one with the TensorFlow backend

PARITY_WORKER = """
import json, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np, onnxruntime as ort, tensorflow as tf
saved_model, onnx_path, golden = sys.argv[1], sys.argv[2], np.load(sys.argv[3])
feeds = {k: golden[k] for k in golden.files}
tf_out = tf.saved_model.load(saved_model).signatures["serving_default"](
    **{k: tf.constant(v) for k, v in feeds.items()})
session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
names = [o.name for o in session.get_outputs()]
report = {}
for name, value in zip(names, session.run(names, feeds)):
    reference = tf_out[name].numpy()
    report[name] = float(np.abs(value.astype(np.float64) - reference).max(initial=0.0))
print(json.dumps(report))
"""


def tensorflow_env() -> dict[str, str]:
    """The environment of the TensorFlow processes (tf2onnx, the parity worker): ours, with
    TF_USE_LEGACY_KERAS set where tf_keras is not installed.  ``import tensorflow`` eagerly imports
    Keras 3 and through it scikit-learn, which neither converting nor running a serving signature
    needs; with the variable TensorFlow looks for tf_keras instead, does not find it and skips the
    import: 3.8 s of CPU per conversion instead of 6.9 s here (TensorFlow 2.21, the template's
    image_model; the same graph, only tf2onnx's generated constant names differ as they do
    between two runs).  A value the operator set, or an installed tf_keras, is left alone."""
    env = dict(os.environ)
    if importlib.util.find_spec("tf_keras") is None:
        env.setdefault("TF_USE_LEGACY_KERAS", "1")
    return env


def needs_onnx(server_version: str) -> bool:
    """True for a Triton release without the TensorFlow backend."""
    try:
        major, minor = (int(p) for p in server_version.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) > TF_BACKEND_LAST


def convert_step(step: Step, golden: dict[str, np.ndarray], gpu: bool, registry: RegistryReader) -> Converted:
    """Convert ``step``'s SavedModel to a local ONNX version folder; check parity on the golden inputs."""
    if importlib.util.find_spec("tf2onnx") is None:
        raise MissingDependencyError("tf2onnx", "export", "Serving a SavedModel as ONNX")
    assert step.folder is not None
    config = parse_config(step.config_text)
    saved_model = step.folder / step.version / (config.default_model_filename or "model.savedmodel")
    derived = step.folder.parent / f"onnx-{step.model}"
    (derived / "new").mkdir(parents=True, exist_ok=True)
    onnx_path = derived / "new" / "model.onnx"
    _tf2onnx(step, saved_model, onnx_path)
    parity = _parity(saved_model, onnx_path, golden)
    worst = max(parity.values(), default=0.0)
    if worst > PARITY_ATOL + PARITY_RTOL * 1e3:
        raise PromotionError(
            f"the ONNX conversion of {step.model} v{step.version} differs from the "
            f"SavedModel by up to {worst:.3g} on the golden inputs",
            fix="check the model's ops with tf2onnx, or serve it natively",
        )
    config.platform = "onnxruntime_onnx"
    config.backend = ""
    config.default_model_filename = "model.onnx"
    config.ClearField("version_policy")
    (derived / CONFIG_NAME).write_text(format_config(config))
    digest = artifact_digest(derived / "new", derived / CONFIG_NAME)  # what its registration records
    existing = _registered_with(registry, step.model, digest)
    version = existing or _next_version(registry, step.model)
    (derived / "new").rename(derived / version)
    # the SavedModel's step with the ONNX version in its place: what serves before, and the digests
    # MLflow records for it (an abort loads them again only once they verify), are kept
    converted = replace(
        step,
        version=version,
        folder=derived,
        config_text=desired_config((derived / CONFIG_NAME).read_text(), [version], gpu),
        upload=True,
        reload=False,
        digest=digest,
    )
    info = {
        "derived_from": f"{step.model} v{step.version}",
        "tf2onnx_opset": OPSET,
        "parity_max_abs_diff": worst,
    }
    return Converted(converted, step.version, parity, info, existing is not None)


def register_converted(registry: DerivedVersions, tags: RegistryWriter, converted: Converted) -> str:
    """Register the ONNX version (an identical one is reused) and tag what it derives from
    (``tags``: the registry's ``models``); returns the number it got."""
    step = converted.step
    assert step.folder is not None
    version = registry.register_version(
        step.model, step.folder / step.version, step.folder / CONFIG_NAME, export_info=converted.export_info
    )
    tags.set_version_tag(step.model, version, "derived_from", converted.source_version)
    return version


def _tf2onnx(step: Step, saved_model: Path, onnx_path: Path) -> None:
    argv = ["-m", "tf2onnx.convert", "--saved-model", str(saved_model), "--signature_def", "serving_default"]
    argv += ["--opset", str(OPSET), "--output", str(onnx_path)]
    run = _tensorflow(argv, f"tf2onnx converting {step.model} v{step.version}")
    if run.returncode != 0 or not onnx_path.is_file():
        raise PromotionError(
            f"tf2onnx could not convert {step.model} v{step.version}: "
            f"{run.stderr.strip().splitlines()[-1:] or ['no output']}",
            fix="serve it natively (--serve-as native) on a Triton with TensorFlow",
        )


def _tensorflow(argv: list[str], what: str) -> subprocess.CompletedProcess[str]:
    """``python ARGV`` in tensorflow_env(), its output captured, within TENSORFLOW_TIMEOUT_S."""
    try:
        return subprocess.run(
            [sys.executable, *argv],
            capture_output=True,
            text=True,
            check=False,
            env=tensorflow_env(),
            timeout=TENSORFLOW_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        raise PromotionError(
            f"{what} did not finish within {TENSORFLOW_TIMEOUT_S} s (stopped)",
            fix="serve it natively (--serve-as native) on a Triton with TensorFlow, "
            "or check the SavedModel's ops with tf2onnx by hand",
        ) from exc


def _registered_with(registry: RegistryReader, model: str, digest: str) -> str | None:
    for version in registry.versions(model):
        if (getattr(version, "tags", None) or {}).get("artifact_digest") == digest:
            return str(version.version)
    return None


def _next_version(registry: RegistryReader, model: str) -> str:
    return str(max((int(v.version) for v in registry.versions(model)), default=0) + 1)


def _parity(saved_model: Path, onnx_path: Path, golden: dict[str, np.ndarray]) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="mlreg-parity-") as tmp:
        inputs = Path(tmp) / "golden.npz"
        np.savez(inputs, **golden)
        argv = ["-c", PARITY_WORKER, str(saved_model), str(onnx_path), str(inputs)]
        run = _tensorflow(argv, "the parity check of the ONNX conversion")
    if run.returncode != 0:
        raise PromotionError(
            f"parity check of the ONNX conversion failed: "
            f"{run.stderr.strip().splitlines()[-1:] or ['no output']}",
            fix="serve it natively (--serve-as native)",
        )
    return {k: float(v) for k, v in json.loads(run.stdout.strip().splitlines()[-1]).items()}
