"""``mlreg init [PATH] [--from FILE] [--name NAME]``: a project of your own, ready for ``validate``.

It writes a commented ``mlreg.toml`` (the built-in ``local`` environment needs no section; a fleet
on S3 is there to uncomment) and, given a model file -- an ONNX graph, a SavedModel folder or a
python-backend ``model.py`` -- a Triton model folder ``models/<name>/config.pbtxt`` +
``models/<name>/1/<file>``, the config completed as Triton's auto-complete would
(``registry.contracts.autocomplete`` for the backend fields; the graph's tensors and batching as
the ONNX Runtime backend fills them, ``registry.nvidia_flavors``; a ``model.py``'s own
``auto_complete_config``), and golden inputs made from the contract in the template's layout
(``models/golden_inputs.py`` reads ``models/<name>.golden.json``).  The model folder is checked
with ``validate``'s own rules before anything is written; no file is overwritten unless
``force``.
"""

from __future__ import annotations

import ast
import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from registry.contracts.config import CONFIG_NAME, data_type_name, format_config, model_config_pb2
from registry.errors import ContractError, UsageError
from registry.register import MODEL_NAME

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

SETTINGS_FILE = "mlreg.toml"
REPOSITORY = "models"  # the project's model repository folder: one folder per model
GOLDEN_MODULE = "golden_inputs.py"
GOLDEN_SUFFIX = ".golden.json"
VERSION = "1"
DTYPES = {  # Triton's data type -> the numpy dtype of its golden inputs (BF16: numpy has none)
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BF16": "float32",
    "STRING": "bytes",
}

SETTINGS_TEXT = """\
# mlreg.toml: where this project's models are promoted.  Every mlreg command run in this folder (or
# below it) reads it; its state (the embedded MLflow registry, the local stack, the local store)
# lives in .mlreg/ beside it.
#
# The built-in environment `local` needs no section here: `mlreg promote MODEL --version N`
# writes .mlreg/model_repository and loads the version into the local stack (`mlreg stack up`,
# `--replicas N` for a local fleet).
#
# A fleet of Triton servers reading one S3 store: uncomment the section below, fill in your
# endpoint, bucket and servers, and promote with `--env fleet`.  The bucket must exist (create it
# first); credentials come from the AWS_* variables, never from this file, and the servers run
# with `--model-control-mode=explicit --model-repository=<the same store>`.
#
# [environments.fleet]
# store = "s3://127.0.0.1:9000/models/fleet"    # Triton's syntax: s3://[host:port/]bucket/prefix
# targets = ["127.0.0.1:8001", "127.0.0.1:8011"]  # gRPC of each replica; the first is the canary
# alias = "fleet"                               # the MLflow alias this environment moves
# gpu = false                                   # true keeps KIND_GPU instance groups
# keep = 2                                      # versions per model the servers read
# control_key = "env:MLREG_FLEET_CONTROL_KEY"   # the variable holding the servers' control key
# canary = 1                                    # replicas that take the new version first
# bake_seconds = 60                             # the canary serves this long before the others
# min_requests = 10                             # requests the canary must answer in the bake
#
# [environments.fleet.metrics]                  # where each replica's Triton metrics are read
# "127.0.0.1:8001" = "http://127.0.0.1:8002/metrics"
# "127.0.0.1:8011" = "http://127.0.0.1:8012/metrics"
"""

GOLDEN_TEXT = '''\
"""Golden inputs of this repository's models, in the layout of mlreg's template
(``model_inputs`` and ``quality_spec``): the quality gate sends them to each candidate version
when MLREG_TEMPLATE_DIR names this folder.  ``mlreg init`` wrote them from each model's contract
(``<model>.golden.json``: per input its dtype, shape and values); replace the values with real
requests, and add output ranges under "quality" (e.g. {"output": {"min": 0, "max": 1}}).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _golden(model: str) -> dict | None:
    path = HERE / f"{model}.golden.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _array(tensor: dict) -> np.ndarray:
    if tensor["dtype"] == "bytes":
        values = [str(value).encode() for value in tensor["data"]]
        return np.array(values, dtype=np.object_).reshape(tensor["shape"])
    return np.array(tensor["data"], dtype=tensor["dtype"]).reshape(tensor["shape"])


def model_inputs(model: str) -> dict[str, np.ndarray] | None:
    golden = _golden(model)
    if golden is None:
        return None
    return {name: _array(tensor) for name, tensor in golden["inputs"].items()}


def quality_spec(model: str) -> dict:
    golden = _golden(model)
    return dict(golden.get("quality", {})) if golden else {}
'''


@dataclass(frozen=True)
class Source:
    """What ``--from`` names: its kind and the file name Triton looks for in the version folder."""

    path: Path
    kind: str  # "onnx", "savedmodel" or "python"
    filename: str


@dataclass
class InitReport:
    """What ``init`` wrote (paths relative to the project), and what it left as it was."""

    project: Path
    written: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    model: str = ""
    kind: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "project": str(self.project),
            "written": self.written,
            "kept": self.kept,
            "model": self.model or None,
            "kind": self.kind or None,
            "repository": REPOSITORY,
        }


def init_project(
    path: Path, source: Path | None = None, name: str | None = None, *, force: bool = False
) -> InitReport:
    """Write ``mlreg.toml`` into ``path`` and, with ``source``, the model folder made of it.

    An existing ``mlreg.toml`` is kept when a model is added (``source``); any other file that
    exists is refused before anything is written, unless ``force``."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"'{path}' is a file, not a project folder", fix="pass a folder (or omit PATH)")
    report = InitReport(path)
    files: dict[str, bytes | Path] = {}
    settings_file = path / SETTINGS_FILE
    if source is not None and settings_file.exists() and not force:
        report.kept.append(SETTINGS_FILE)
    else:
        files[SETTINGS_FILE] = SETTINGS_TEXT.encode()
    with tempfile.TemporaryDirectory(prefix="mlreg-init-") as tmp:
        if source is not None:
            found = read_source(source)
            report.model = model_name(found, name)
            report.kind = found.kind
            files.update(model_files(found, report.model, Path(tmp)))
        _refuse_existing(path, files, force)
        for relative, content in files.items():
            _write(path / relative, content)
            report.written.append(relative)
    return report


def read_source(path: Path) -> Source:
    """The kind of model ``path`` is, by what it holds (not only its name)."""
    if path.is_dir() and (path / "saved_model.pb").is_file():
        return Source(path, "savedmodel", "model.savedmodel")
    if path.is_file() and path.suffix == ".onnx":
        return Source(path, "onnx", "model.onnx")
    if path.is_file() and path.suffix == ".py":
        return Source(path, "python", "model.py")
    what = "does not exist" if not path.exists() else "is none of them"
    raise UsageError(
        f"--from '{path}' {what}: mlreg init takes an ONNX file (.onnx), a SavedModel folder "
        "(holding saved_model.pb) or a python-backend model (.py)",
        fix="pass one of those, or write the model folder (config.pbtxt + 1/) yourself",
    )


def model_name(source: Source, name: str | None) -> str:
    """``name``, else the source's: the file's stem, a SavedModel's folder, a ``model.py``'s folder."""
    if name is None:
        plain = source.kind == "python" and source.path.stem == "model"
        name = source.path.resolve().parent.name if plain else source.path.stem
        if source.kind == "savedmodel":
            name = source.path.resolve().name
    if not MODEL_NAME.match(name) or name == REPOSITORY:
        raise UsageError(
            f"'{name}' cannot name a Triton model: use letters, digits, '.', '-' and '_', "
            "starting with a letter or digit",
            fix="pass --name NAME",
        )
    return name


def model_files(source: Source, name: str, scratch: Path) -> dict[str, bytes | Path]:
    """The model folder's files (made under ``scratch``, checked with ``validate``'s rules) and its
    golden inputs, by their paths in the project."""
    folder = scratch / REPOSITORY / name
    version = folder / VERSION
    version.mkdir(parents=True)
    if source.kind == "savedmodel":
        shutil.copytree(source.path, version / source.filename)
    else:
        shutil.copy2(source.path, version / source.filename)
    config = completed_config(name, source, folder)
    (folder / CONFIG_NAME).write_text(format_config(config))
    _check(folder)
    files: dict[str, bytes | Path] = {
        f"{REPOSITORY}/{name}/{CONFIG_NAME}": (folder / CONFIG_NAME).read_bytes(),
        f"{REPOSITORY}/{name}/{VERSION}/{source.filename}": version / source.filename,
        f"{REPOSITORY}/{GOLDEN_MODULE}": GOLDEN_TEXT.encode(),
        f"{REPOSITORY}/{name}{GOLDEN_SUFFIX}": golden_json(config).encode(),
    }
    return files


def completed_config(name: str, source: Source, folder: Path) -> ModelConfig:
    """A config holding only the name, completed as Triton would: the backend fields from the
    files, then the tensors and batching from the graph (ONNX, SavedModel) or from ``model.py``'s
    ``auto_complete_config``."""
    from registry.nvidia_flavors import complete, complete_onnx_io  # lazy: the registration module, init only

    config = model_config_pb2().ModelConfig()
    config.name = name
    complete(name, config, folder, fields=True)  # ONNX: its tensors and batching too
    if source.kind == "savedmodel":
        from registry.contracts.signature import read_saved_model  # lazy: ~40 ms, SavedModels only

        complete_onnx_io(name, config, read_saved_model(folder / VERSION / source.filename))
    elif source.kind == "python":
        python_io(config, source.path)
    group = config.instance_group.add()
    group.kind, group.count = group.KIND_CPU, 1
    return config


def python_io(config: ModelConfig, path: Path) -> None:
    """The tensors and max_batch_size a ``model.py``'s ``auto_complete_config`` declares, read from
    its source (never run): ``add_input({...})``/``add_output({...})`` of literal dicts, lists of
    them assigned to a name holding "input" or "output", and ``set_max_batch_size(N)``."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError) as exc:
        raise UsageError(f"cannot read '{path}' as Python: {exc}", fix="pass a readable model.py") from exc
    inputs: list[dict[str, Any]] = []
    outputs: list[dict[str, Any]] = []
    for function in _functions(tree, "auto_complete_config"):
        for node in ast.walk(function):
            _collect(node, inputs, outputs, config)
    if not inputs or not outputs:
        raise UsageError(
            f"'{path}' declares no inputs or outputs mlreg can read: Triton's python backend learns "
            "them from the model's auto_complete_config (add_input/add_output) or config.pbtxt",
            fix="add an auto_complete_config that calls add_input({'name': ..., 'data_type': "
            "'TYPE_FP32', 'dims': [...]}) and add_output(...), or write config.pbtxt yourself",
        )
    for tensors, added in ((inputs, config.input), (outputs, config.output)):
        for tensor in tensors:
            _tensor(added.add(), tensor, path)


def _functions(tree: ast.AST, name: str) -> Iterator[ast.FunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            yield node


def _collect(
    node: ast.AST, inputs: list[dict[str, Any]], outputs: list[dict[str, Any]], config: ModelConfig
) -> None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
        _called(node.func.attr, _literal(node.args[0]), inputs, outputs, config)
    elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        literal = _literal(node.value)
        if isinstance(literal, list) and all(isinstance(item, dict) for item in literal):
            target = node.targets[0].id.lower()
            found = outputs if "output" in target else inputs if "input" in target else []
            found.extend(literal)


def _called(
    method: str,
    literal: Any,
    inputs: list[dict[str, Any]],
    outputs: list[dict[str, Any]],
    config: ModelConfig,
) -> None:
    """``add_input({...})``, ``add_output({...})`` or ``set_max_batch_size(N)`` with a literal."""
    if method in ("add_input", "add_output") and isinstance(literal, dict):
        (inputs if method == "add_input" else outputs).append(literal)
    elif method == "set_max_batch_size" and isinstance(literal, int):
        config.max_batch_size = literal


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _tensor(io: Any, tensor: dict[str, Any], path: Path) -> None:
    types = model_config_pb2().DataType
    data_type = str(tensor.get("data_type", ""))
    dims = tensor.get("dims")
    name = tensor.get("name")
    valid_dims = isinstance(dims, list) and all(isinstance(d, int) and d >= -1 for d in dims)
    if not isinstance(name, str) or data_type not in types.keys() or not valid_dims:
        raise UsageError(
            f"'{path}': auto_complete_config declares a tensor mlreg cannot read: {tensor!r}",
            fix="give each a 'name', a 'data_type' such as 'TYPE_FP32' and 'dims' as a list of integers",
        )
    io.name, io.data_type = name, types.Value(data_type)
    io.dims.extend(dims)


def _check(folder: Path) -> None:
    """``validate``'s rules on the model folder: an error is init's bug or the model's, never
    written."""
    from registry.contracts.validate import validate_path  # lazy: ~9 ms, the rules

    errors = [f for f in validate_path(folder).findings if f.is_error]
    if errors:
        raise ContractError(
            f"the config made of '{folder.name}' fails validation: "
            + "; ".join(f.line().replace(str(folder.parent), REPOSITORY) for f in errors),
            fix="fix the model (or write its config.pbtxt yourself, and run 'mlreg validate')",
            model=folder.name,
        )


def golden_json(config: ModelConfig) -> str:
    """The golden inputs of ``config``'s model: per input, one request (a batch of one where the
    model batches) of fixed values in the input's type; "quality" is for declared output ranges."""
    batch = [1] if config.max_batch_size > 0 else []
    inputs = {}
    for tensor in config.input:
        shape = batch + [max(int(d), 1) for d in tensor.dims]
        dtype = DTYPES.get(data_type_name(tensor.data_type), "float32")
        inputs[tensor.name] = {"dtype": dtype, "shape": shape, "data": _values(dtype, shape)}
    return json.dumps({"inputs": inputs, "quality": {}}, indent=1) + "\n"


def _values(dtype: str, shape: list[int]) -> list[Any]:
    """Fixed, small values: a ramp in [0, 1] for floats, 0..3 for integers, alternating booleans."""
    count = 1
    for dim in shape:
        count *= dim
    if dtype == "bytes":
        return ["mlreg"] * count
    if dtype == "bool":
        return [index % 2 == 0 for index in range(count)]
    if dtype.startswith("float"):
        return [round(index / max(count - 1, 1), 6) for index in range(count)]
    return [index % 4 for index in range(count)]


def _refuse_existing(project: Path, files: dict[str, bytes | Path], force: bool) -> None:
    there = [relative for relative in files if (project / relative).exists()]
    if force:
        return
    same = [r for r in there if isinstance(files[r], bytes) and (project / r).read_bytes() == files[r]]
    clash = [r for r in there if r not in same]
    for relative in same:  # identical bytes (the shared golden_inputs.py): nothing to write
        del files[relative]
    if clash:
        raise UsageError(
            f"{project}: {', '.join(clash)} already exist(s); mlreg init overwrites nothing",
            fix="pass --force to overwrite them, or choose another PATH or --name",
        )


def _write(target: Path, content: bytes | Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        target.write_bytes(content)
    elif content.is_dir():
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(content, target)
    else:
        shutil.copy2(content, target)


__all__ = ["InitReport", "init_project"]
