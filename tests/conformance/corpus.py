"""The conformance corpus: one minimal model repository per Triton rule, its expected verdict beside it.

Each case folder holds model folders (``config.pbtxt``; version folders are added by
:func:`materialize` where the case has none) and ``expected.txt``:

- ``verdict``: what Triton 2.51 does when ``load`` is loaded (``accept`` / ``reject``);
- ``mlreg``: mlreg's verdict where it differs on purpose (a fault Triton loads but that fails at
  inference: mlreg reports it labelled ``[mlreg]``); defaults to ``verdict``;
- ``names``: the tensor / field both must name, as Triton's ``message`` writes it (required for every
  case that Triton or mlreg rejects); ``message``: Triton's wording, which mlreg uses;
- ``decided-by``: ``core`` (Triton's config checks, any backend) or ``backend`` (only the model's
  backend decides, e.g. NVIDIA's C++ onnxruntime backend; the local stack runs a stand-in).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

CORPUS = Path(__file__).parent
TRITON_VERSION = "2.51.0"  # the tritonserver (nvidia-pytriton 0.7.0's binary) the verdicts were read from
PYTHON_MODEL = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[]) for _ in requests]
"""


@dataclass(frozen=True)
class Case:
    name: str
    folder: Path
    verdict: str
    mlreg: str
    load: str
    names: str
    message: str
    decided_by: str

    @property
    def models(self) -> list[Path]:
        return sorted(p for p in self.folder.iterdir() if (p / "config.pbtxt").is_file())


def _fields(path: Path) -> dict[str, str]:
    fields = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def load_cases() -> list[Case]:
    cases = []
    for expected in sorted(CORPUS.glob("*/expected.txt")):
        f = _fields(expected)
        cases.append(
            Case(
                name=expected.parent.name,
                folder=expected.parent,
                verdict=f["verdict"],
                mlreg=f.get("mlreg", f["verdict"]),
                load=f["load"],
                names=f.get("names", ""),
                message=f.get("message", ""),
                decided_by=f.get("decided-by", "core"),
            )
        )
    return cases


def materialize(case: Case, repository: Path) -> None:
    """Copy the case's model folders into ``repository``, adding ``1/`` (with a python model where the
    backend is python or left to auto-complete) to each model folder that has no version folder."""
    for model in case.models:
        target = repository / model.name
        shutil.copytree(model, target)
        if any(p.is_dir() and p.name.isdigit() for p in target.iterdir()):
            continue
        (target / "1").mkdir()
        text = (target / "config.pbtxt").read_text()
        if 'platform: "ensemble"' not in text:
            (target / "1" / "model.py").write_text(PYTHON_MODEL)
